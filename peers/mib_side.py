"""MIB's side of ``peers/mib_lm.py``: MIB's circuit localization, run by its own code, on
a local Llama-architecture folder (SmolLM2-135M-Instruct) and MIB-format pairs.

Runs under the peer environment's python, with MIB-circuit-track and EAP-IG on
PYTHONPATH (``mib_lm.py`` and peers/README.md say how to set it up); it imports nothing
of this project (not even peers/peer_harness.py) and is started by ``mib_lm.py``, never
by the workflow or the tests. It
follows MIB's ``run_attribution.py`` and ``run_evaluation.py``: the model through
TransformerLens 2's ``HookedTransformer.from_pretrained`` (its default weight
processing) with MIB's four switches (split q/k/v inputs, attention results, MLP inputs,
ungrouped grouped-query attention), MIB's dataset class and batch loader, its
``logit_diff`` metric (mean loss for attribution, per example for evaluation),
``eap.attribute.attribute`` and ``evaluate_area_under_curve`` (greedy circuits for
information flow routes), and writes each method's circuit file with EAP-IG's
``Graph.to_json``.

The adapter, all of it here and none in the peers' code (:func:`load_model`), because
TransformerLens 2.15.4 has no SmolLM2 among its official models and transformers 4.46
(MIB's pin) reads a transformers-5 checkpoint folder only in part:

1. ``loading.get_official_model_name`` answers the folder's own path for that path
   (else its own answer), so ``from_pretrained`` takes TransformerLens's local-folder
   branch of ``get_pretrained_model_config``;
2. ``loading.convert_hf_model_config`` for that folder adds ``rotary_base`` = the
   folder's ``rope_parameters.rope_theta`` (100000: TransformerLens's generic Llama
   branch leaves the default 10000) and caps ``n_ctx`` at ``--n-ctx`` (2048; it only
   sizes the causal mask and rotary tables, each prompt is under 30 tokens);
3. the Hugging Face model is loaded by the caller (``hf_model=``) from a config whose
   ``rope_theta`` is set the same way (transformers 4.46 does not read
   ``rope_parameters``), in float32 with eager attention;
4. the tokenizer is the folder's ``tokenizer.json`` as ``PreTrainedTokenizerFast`` with
   ``add_bos_token=True`` in its init arguments (the folder names a transformers-5 class,
   ``TokenizersBackend``, that ``AutoTokenizer`` 4.46 cannot load; TransformerLens would
   reload it with that argument, which a fast tokenizer without a BOS post-processor
   ignores): the same ids, and TransformerLens then prepends the BOS itself, as it does
   on this tokenizer;
5. on a machine without CUDA, ``torch.zeros(..., device='cuda')`` (EAP-IG's score
   buffers) makes its tensor on the CPU.

The model's logits are checked against the Hugging Face model's (centred over the
vocabulary: ``center_unembed`` moves every logit of a position by one constant) before
anything is scored. Writes to ``--out``: ``check.json`` (the tokens MIB fed, the logit
check) and per method ``<method>.json`` (the circuit file), ``<method>_run.json``
(faithfulness curves, areas, edge counts, seconds). With ``--evaluate FILE ...`` it
evaluates those circuit files instead (``<stem>_eval.json``).
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path

METHODS = {"eap": "EAP", "eap-ig": "EAP-IG-inputs", "ifr": "information-flow-routes", "eactp": "exact"}


def cpu_zeros():
    import torch

    if torch.cuda.is_available():
        return
    zeros = torch.zeros

    def on_cpu(*args, **kwargs):
        if str(kwargs.get("device", "")) == "cuda":
            kwargs["device"] = "cpu"
        return zeros(*args, **kwargs)

    torch.zeros = on_cpu


def load_official(folder: str, n_ctx: int, official: str):
    """A model TransformerLens knows by ``official`` (Gemma-3-270M from TransformerLens
    2.18: ``google/gemma-3-270m``), its weights the folder's, read by the environment's
    transformers (4.57 reads Gemma-3's folder whole), its tokenizer the folder's own
    ``tokenizer.json`` (Gemma-3's puts its ``<bos>`` first itself); nothing is fetched:
    TransformerLens's configuration of that name is built in."""
    import torch
    from transformer_lens import HookedTransformer
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    hf = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32, attn_implementation="eager").eval()
    tok = PreTrainedTokenizerFast.from_pretrained(folder)
    model = HookedTransformer.from_pretrained(
        official, hf_model=hf, tokenizer=tok, device="cpu", dtype="float32", n_ctx=n_ctx
    )
    return model, hf


def mib_switches(model):
    """MIB's run_attribution.py / run_evaluation.py's four switches."""
    model.cfg.use_split_qkv_input = True
    model.cfg.use_attn_result = True
    model.cfg.use_hook_mlp_in = True
    model.cfg.ungroup_grouped_query_attention = True
    return model


def versions() -> dict:
    """The peer environment's TransformerLens and transformers."""
    from importlib.metadata import version

    return {"transformer_lens": version("transformer-lens"), "transformers": version("transformers")}


def load_model(folder: str, n_ctx: int, official: str | None = None):
    if official:
        model, hf = load_official(folder, n_ctx, official)
        return mib_switches(model), hf
    import torch
    import transformer_lens.loading_from_pretrained as loading
    from transformer_lens import HookedTransformer
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    folder = str(Path(folder).resolve())
    raw = json.loads((Path(folder) / "config.json").read_text())
    theta = raw.get("rope_theta") or raw["rope_parameters"]["rope_theta"]
    official, convert = loading.get_official_model_name, loading.convert_hf_model_config
    loading.get_official_model_name = lambda name: name if name == folder else official(name)

    def converted(name, **kwargs):
        d = convert(name, **kwargs)
        if name == folder:
            d.update(rotary_base=theta, n_ctx=min(int(d["n_ctx"]), n_ctx))
        return d

    loading.convert_hf_model_config = converted
    hf_cfg = AutoConfig.from_pretrained(folder)
    hf_cfg.rope_theta = theta
    hf = AutoModelForCausalLM.from_pretrained(
        folder, config=hf_cfg, torch_dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tok = PreTrainedTokenizerFast.from_pretrained(folder, add_bos_token=True)
    model = HookedTransformer.from_pretrained(folder, hf_model=hf, tokenizer=tok, device="cpu", dtype="float32")
    return mib_switches(model), hf


def dataset(rows: list[dict], tokenizer):
    """MIB's IOI dataset class over these rows (its filter needs a ``random_c`` field the
    rows lack; the rows given are used as they are). A counterfactual given as a string
    (the project's files) becomes MIB's ``{"prompt": ...}``."""
    from MIB_circuit_track.dataset import HFEAPDataset

    ds = HFEAPDataset.__new__(HFEAPDataset)
    ds.task, ds.tokenizer, ds.control, ds.model_name = "ioi", tokenizer, False, None
    cf = "s2_io_flip_counterfactual"
    rows = [{**r, cf: r[cf] if isinstance(r[cf], dict) else {"prompt": r[cf]}} for r in rows]
    ds.counterfactual_type, ds.dataset, ds.answer_map, ds.seed_offset = None, rows, {}, 0
    return ds


def check(model, hf, loader) -> dict:
    """The tokens MIB feeds (``tokenize_plus``) and the largest difference of the
    TransformerLens logits from the Hugging Face model's, both centred per position."""
    import torch
    from eap.utils import tokenize_plus

    out = {"clean": [], "corrupt": [], "labels": [], "logits_max_abs_diff": 0.0, "logits_max_abs": 0.0}
    read = []
    for clean, corrupt, labels in loader:
        t, mask, lengths, _ = tokenize_plus(model, clean)
        r, _, _, _ = tokenize_plus(model, corrupt)
        with torch.no_grad():
            a = model(t, attention_mask=mask)
            b = hf(t, attention_mask=mask).logits
        a, b = a - a.mean(-1, keepdim=True), b - b.mean(-1, keepdim=True)
        keep = mask.bool()
        out["logits_max_abs_diff"] = max(out["logits_max_abs_diff"], float((a - b)[keep].abs().max()))
        out["logits_max_abs"] = max(out["logits_max_abs"], float(b[keep].abs().max()))
        for i in range(len(clean)):
            n = int(lengths[i])
            out["clean"].append(t[i, :n].tolist())
            out["corrupt"].append(r[i, :n].tolist())
            read.append(a[i, n - 1].tolist())
        out["labels"] += [list(x) for x in labels]
    out["read_logits_centred"] = read
    return out


def evaluate(model, graph, loader, greedy: bool) -> dict:
    from MIB_circuit_track.evaluation import evaluate_area_under_curve
    from MIB_circuit_track.metrics import get_metric

    metric = partial(get_metric("logit_diff", "ioi", model.tokenizer, model), mean=False, loss=False)
    out = {}
    for kind, absolute in (("signed", False), ("absolute", True)):
        counts, under, from_1, _, faith = evaluate_area_under_curve(
            model, graph, loader, metric, quiet=True, level="edge", absolute=absolute, apply_greedy=greedy
        )
        out[kind] = {"weighted_edge_counts": counts, "area_under": under, "area_from_1": from_1, "faithfulness": faith}
    out["cpr"], out["cmd"] = out["signed"]["area_under"], out["absolute"]["area_from_1"]
    return out


def clock(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the model folder")
    ap.add_argument("--data", required=True, help="a MIB-format IOI JSONL file (prompt, s2_io_flip_counterfactual)")
    ap.add_argument("--n", type=int, default=20, help="the first N rows")
    ap.add_argument("--batch-size", type=int, default=20)
    ap.add_argument("--ig-steps", type=int, default=5)
    ap.add_argument("--methods", nargs="+", default=["eap", "eap-ig", "ifr"], choices=sorted(METHODS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument(
        "--official", default=None, help="load as this TransformerLens model name, the weights the folder's"
    )
    ap.add_argument("--evaluate", nargs="*", default=None, help="circuit files to evaluate (method from the stem)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)

    import torch

    torch.set_num_threads(a.threads)
    cpu_zeros()
    from eap.attribute import attribute
    from eap.graph import Graph
    from MIB_circuit_track.metrics import get_metric

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model, hf = load_model(a.model, a.n_ctx, a.official)
    rows = [json.loads(line) for line in Path(a.data).read_text().splitlines() if line.strip()][: a.n]
    loader = dataset(rows, model.tokenizer).to_dataloader(batch_size=a.batch_size)
    if a.evaluate is not None:
        for f in a.evaluate:
            method = Path(f).stem.split("_")[-1]
            res, wall, cpu = clock(lambda f=f: evaluate(model, Graph.from_json(f), loader, method == "ifr"))
            (out / f"{Path(f).stem}_eval.json").write_text(json.dumps({**res, "wall_s": wall, "cpu_s": cpu}))
        return
    (out / "check.json").write_text(json.dumps({**check(model, hf, loader), "versions": versions()}))
    del hf
    metric = partial(get_metric("logit_diff", "ioi", model.tokenizer, model), mean=True, loss=True)
    for method in a.methods:
        graph = Graph.from_model(model)
        _, s_wall, s_cpu = clock(lambda g=graph, m=method: attribute(
            model, g, loader, metric, METHODS[m], "patching", ig_steps=a.ig_steps,
            intervention_dataloader=loader, quiet=True))  # fmt: skip
        graph.to_json(str(out / f"{method}.json"))
        saved = Graph.from_json(str(out / f"{method}.json"))  # as run_evaluation.py reads it
        res, e_wall, e_cpu = clock(lambda g=saved, m=method: evaluate(model, g, loader, m == "ifr"))
        times = {"score_wall_s": s_wall, "score_cpu_s": s_cpu, "eval_wall_s": e_wall, "eval_cpu_s": e_cpu}
        (out / f"{method}_run.json").write_text(json.dumps({**res, **times, "n": len(rows)}))
        print(f"{method}: score {s_wall:.1f} s wall, eval {e_wall:.1f} s wall", flush=True)


if __name__ == "__main__":
    main()
