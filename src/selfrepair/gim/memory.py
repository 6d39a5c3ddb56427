"""The memory plan of a MIB job: its peak memory worked out from the model's
configuration, the method, the batch, the positions and the dtype before anything is
scored (:func:`plan`); the batch that fits a budget (:func:`fitting_batch`), and the
budget itself (:func:`available_bytes`: free GPU memory, or the machine's available
memory on the CPU, unless ``gim.mib.memory_gb`` sets it).

Every component is a count of tensor elements times their size, after the buffers of
:func:`attribute.edge_scores` and :func:`evaluate.faithfulness_curves`:

- ``weights``: the parameters. On the CPU, the checkpoint's tensors are mapped from the
  file and only the pages read become resident, so an untied input embedding counts as
  the rows read (``resident_embedding=False``: none; see docs/MIB.md);
- ``runtime``: the Python, torch and transformers process before the model (CPU only);
- ``activations``: the two node buffers [B, T, n_forward, d] (the two runs' activations
  whose difference scores the edges; the evaluation's clean and corrupted runs);
- ``gradients``: the gradients at every downstream input [B, T, slots, d] (q per head,
  k and v per key-value head, MLP input, logits), twice for the path methods (the sum
  over steps and the step's own);
- ``autograd``: what backward holds of one forward: per layer the split q/k/v inputs and
  their norms, q/k/v, the attention scores and pattern, the per-head results, the MLP's
  hidden states, and the logits with their float32 log-softmax;
- ``scores``: the float32 [n_forward, n_backward] sums and their copies;
- ``loading`` (CPU only, a phase of its own): the checkpoint's check for NaN and inf
  before loading (:func:`models.check_finite`) maps the whole file and copies one tensor
  at a time with its boolean mask: the runtime, the file, and 1.25 times (float32) the
  largest tensor.

``total`` is the larger of the run (every component but ``loading``) and ``loading``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from selfrepair.gim.precision import BYTES

GB = 1e9
RUNTIME_CPU = 0.45 * GB  # measured: the job's process before its model (docs/MIB.md)
MARGIN = 0.10  # of the budget kept free: the allocator's fragmentation, CUDA's context
PATH_METHODS = ("eap-ig", "eap-gp")
MIB_BATCH = 20  # MIB's run_attribution default


# transformers' default of tie_word_embeddings per model_type (config.json may omit it)
TIED_DEFAULT = {"gpt2": True, "gemma2": True, "gemma3_text": True, "llama": False, "qwen2": False}
QK_NORM = ("gemma3_text",)  # model types whose attention normalizes each head's q and k


def _tied(c: dict) -> bool:
    return bool(c.get("tie_word_embeddings", TIED_DEFAULT.get(c.get("model_type"), True)))


@dataclass(frozen=True)
class Shape:
    """What the plan reads of a model's ``config.json``."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    d_mlp: int
    d_vocab: int
    gated: bool
    tied: bool
    n_ctx_learned: int  # learned positional embeddings (GPT-2), else 0
    qk_norm: bool = False  # q and k normalized per head (Gemma-3): their norms' outputs held too

    @classmethod
    def from_config(cls, c: dict) -> Shape:
        """From a Hugging Face ``config.json`` (GPT-2, Llama, Qwen-2, Gemma-2, Gemma-3 keys)."""
        if c.get("model_type") == "gpt2":
            d = c["n_embd"]
            return cls(c["n_layer"], c["n_head"], c["n_head"], d, d // c["n_head"], c.get("n_inner") or 4 * d,
                       c["vocab_size"], False, _tied(c), c["n_positions"])  # fmt: skip
        h, d = c["num_attention_heads"], c["hidden_size"]
        return cls(c["num_hidden_layers"], h, c.get("num_key_value_heads") or h, d, c.get("head_dim") or d // h,
                   c["intermediate_size"], c["vocab_size"], True, _tied(c), 0, c.get("model_type") in QK_NORM)  # fmt: skip

    def ungrouped(self) -> Shape:
        """The shape of the model with a key and value projection per query head
        (``core.models.ungroup_kv``, ``gim.kv_inputs: per_query_head``)."""
        return replace(self, n_kv_heads=self.n_heads)

    @property
    def n_forward(self) -> int:
        return 1 + self.n_layers * (self.n_heads + 1)

    @property
    def n_backward(self) -> int:
        return self.n_layers * (3 * self.n_heads + 1) + 1

    @property
    def grad_slots(self) -> int:
        """Gradient tensors of width d per (example, position): q per head, k and v per
        key-value head, the MLP input per layer, and the final norm's input."""
        return self.n_layers * (self.n_heads + 2 * self.n_kv_heads + 1) + 1

    @property
    def embedding(self) -> int:
        return self.d_vocab * self.d_model

    @property
    def largest(self) -> int:
        """Elements of the largest weight tensor (the embedding, or an MLP matrix)."""
        return max(self.embedding, self.d_model * self.d_mlp)

    @property
    def n_params(self) -> int:
        d, q, kv = self.d_model, self.n_heads * self.d_head, self.n_kv_heads * self.d_head
        attn = d * (q + 2 * kv) + q * d
        mlp = (3 if self.gated else 2) * d * self.d_mlp
        unembed = 0 if self.tied else self.embedding
        return self.embedding + unembed + self.n_ctx_learned * d + self.n_layers * (attn + mlp)


def plan(shape: Shape, method: str, batch: int, positions: int, dtype: str, device: str = "cuda",
         resident_embedding: bool = True, saved: str = "float32") -> dict:  # fmt: skip
    """Peak bytes per component (module docstring) and ``total`` of one MIB method at
    ``batch`` examples of ``positions`` tokens in ``dtype`` (a :data:`BYTES` name), the
    checkpoint's tensors being ``saved`` in that dtype."""
    s, bt, L, d = BYTES[dtype], batch * positions, shape.n_layers, shape.d_model
    cpu = not str(device).startswith("cuda")
    weights = shape.n_params - (0 if resident_embedding or shape.tied else shape.embedding)
    per_layer = (
        2 * (shape.n_heads + 2 * shape.n_kv_heads) * d  # split q/k/v inputs and their norms
        + (shape.n_heads + 2 * shape.n_kv_heads) * shape.d_head  # q, k, v
        + (shape.n_heads + shape.n_kv_heads) * shape.d_head * shape.qk_norm  # normed q, k
        + 3 * shape.n_heads * positions  # scores, pattern, its softmax's output
        + shape.n_heads * (shape.d_head + d)  # z and the per-head results
        + 4 * d  # residual stream, norms, attention and MLP outputs
        + (4 if shape.gated else 2) * shape.d_mlp  # hidden states (gate, up, act, product)
    )
    out = {
        "weights": weights * s,
        "runtime": RUNTIME_CPU if cpu else 0.0,
        "activations": 2 * bt * shape.n_forward * d * s,
        "gradients": (2 if method in PATH_METHODS else 1) * bt * shape.grad_slots * d * s,
        "autograd": bt * (L * per_layer * s + shape.d_vocab * (s + 4)),
        "scores": 3 * shape.n_forward * shape.n_backward * 4,
    }
    out = {k: float(v) for k, v in out.items()}
    run = sum(out.values())
    f = BYTES[saved]
    out["loading"] = float(RUNTIME_CPU + shape.n_params * f + shape.largest * (f + 1)) if cpu else 0.0
    out["total"] = max(run, out["loading"])
    return out


def describe(p: dict) -> str:
    """One line of a plan in GB, e.g. for a log and a status row."""
    parts = [f"{k} {v / GB:.2f}" for k, v in p.items() if k != "total" and (v or k != "loading")]
    return f"planned {p['total'] / GB:.2f} GB (" + ", ".join(parts) + ")"


def batch_choices(n_eval: int, most: int = MIB_BATCH, divisors: bool = True) -> list[int]:
    """Batches :func:`fitting_batch` may pick, largest first: at most ``most`` and
    ``n_eval``; under MIB's batch weighting, divisors of ``n_eval`` only (full batches)."""
    top = min(most, n_eval)
    return [b for b in range(top, 0, -1) if not divisors or n_eval % b == 0]


def fitting_batch(plan_of, budget: float, choices: list[int]) -> int | None:
    """The first of ``choices`` whose plan (``plan_of(batch)['total']``) fits ``budget``
    less :data:`MARGIN`; None when none fits."""
    for b in choices:
        if plan_of(b)["total"] <= budget * (1 - MARGIN):
            return b
    return None


def available_bytes(device: str, override_gb: float | None = None) -> float:
    """The budget: ``override_gb`` when set, else the device's free memory (CUDA) or the
    machine's available memory (CPU)."""
    if override_gb is not None:
        return float(override_gb) * GB
    if str(device).startswith("cuda"):
        import torch

        return float(torch.cuda.mem_get_info(torch.device(device))[0])
    import psutil

    return float(psutil.virtual_memory().available)


class Budget(float):
    """A job's memory budget in bytes, and the config key that set it (``key``; None: the
    device's free memory, measured): a refusal names the key to change."""

    key: str | None

    def __new__(cls, value: float, key: str | None = None):
        obj = super().__new__(cls, value)
        obj.key = key
        return obj


def job_budget(device: str, override_gb: float | None = None, key: str = "gim.mib.memory_gb") -> float:
    """The whole job's budget at its start: :func:`available_bytes` plus what the job
    already holds (its process's resident memory on the CPU, torch's allocations on a
    GPU), as the plan counts it; ``override_gb`` when set, a :class:`Budget` naming ``key``."""
    if override_gb is not None:
        return Budget(available_bytes(device, override_gb), key)
    if str(device).startswith("cuda"):
        import torch

        return available_bytes(device) + float(torch.cuda.memory_allocated(torch.device(device)))
    import psutil

    return available_bytes(device) + float(psutil.Process().memory_info().rss)


class DoesNotFit(RuntimeError):
    """A MIB job whose batch of 1 (or whose set batch) does not fit its memory budget."""


def refusal(model: str, p: dict, budget: float, batch: int, dtype: str) -> str:
    """The refusal's reason: the plan's numbers and the ways out."""
    ways = ["gim.mib.dtype: bfloat16" if dtype == "float32" else None, "shorter prompts (fewer positions)",
            "a device with more free memory"]  # fmt: skip
    if batch > 1:
        ways.insert(0, "gim.mib.batch_size: auto")
    key = getattr(budget, "key", None)
    if key:  # a budget the config set: the key, and the least value that fits this plan
        ways.insert(0, f"{key}: {p['total'] / (1 - MARGIN) / GB:.2f} or more (null: the device's free memory)")
    what = f"set by {key}" if key else "the device's free memory at the job's start"
    return (
        f"does not fit: {model} at batch {batch} in {dtype} is {describe(p)}; the budget is "
        f"{budget / GB:.2f} GB ({what}) less a {MARGIN:.0%} margin. Ways out: " + "; ".join(w for w in ways if w)
    )
