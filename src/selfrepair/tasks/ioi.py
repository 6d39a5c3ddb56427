"""Indirect object identification (IOI): a toy IOI language and GPT-2 small's prompts.

Toy language: every word is one token. Four templates of 14 words, each in ABBA and
BABA order, e.g. ``When {A} and {B} went to the {P} , {S} gave a {O} to`` -> ``{IO}``,
with the 16 names, 8 places and 8 objects of paper B. A sequence is
``[BOS] template answer``; the model is trained as a language model on all
positions, and the IOI metric is logit[IO] - logit[S] at the last prompt position.

``gpt2_prompts`` builds paper B's GPT-2 prompts ("When {IO} and {S} went to the
{place}, {S} gave a {obj} to") with a tokenizer, keeping those where every name is a
single token, so all prompts have the same length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sequences import Batch

NAMES = ["John", "Mary", "Tom", "James", "Dan", "Sid", "Martin", "Anna", "Paul", "Kate", "Mark", "Lucy", "Peter", "Sarah", "David", "Emma"]
PLACES = ["store", "park", "school", "office", "garden", "station", "market", "library"]
OBJECTS = ["drink", "book", "ball", "ring", "kiss", "snack", "bone", "note"]
TEMPLATES = [
    "When {A} and {B} went to the {P} , {S} gave a {O} to",
    "After {A} and {B} went to the {P} , {S} handed a {O} to",
    "While {A} and {B} were at the {P} , {S} passed a {O} to",
    "Once {A} and {B} walked to the {P} , {S} threw a {O} to",
]
GPT2_TEMPLATE = "When {IO} and {S} went to the {P}, {S} gave a {O} to"
BOS = "<bos>"


def _vocab() -> list[str]:
    words = [BOS]
    for t in TEMPLATES:
        for w in t.split():
            if not w.startswith("{") and w not in words:
                words.append(w)
    return words + NAMES + PLACES + OBJECTS


VOCAB_WORDS = _vocab()
TOKEN = {w: i for i, w in enumerate(VOCAB_WORDS)}
VOCAB = len(VOCAB_WORDS)
PROMPT_LEN = 1 + 14  # BOS + template


@dataclass
class IOIPrompts:
    """Prompts [N, T] (no answer), with the IO and S token ids [N] of each."""

    tokens: torch.Tensor
    io: torch.Tensor
    s: torch.Tensor

    def __len__(self):
        return self.tokens.shape[0]

    def to(self, device) -> "IOIPrompts":
        return IOIPrompts(self.tokens.to(device), self.io.to(device), self.s.to(device))


def sample_toy(n: int, seed: int) -> IOIPrompts:
    """``n`` toy prompts, deterministic from ``seed``; IO != S, ABBA and BABA halves."""
    g = torch.Generator().manual_seed(seed)
    toks, ios, ss = [], [], []
    for i in range(n):
        t = TEMPLATES[int(torch.randint(len(TEMPLATES), (1,), generator=g))]
        a, b = torch.randperm(len(NAMES), generator=g)[:2].tolist()
        io, s = NAMES[a], NAMES[b]
        p = PLACES[int(torch.randint(len(PLACES), (1,), generator=g))]
        o = OBJECTS[int(torch.randint(len(OBJECTS), (1,), generator=g))]
        first, second = (io, s) if i % 2 == 0 else (s, io)
        words = [BOS] + t.format(A=first, B=second, P=p, S=s, O=o).split()
        toks.append([TOKEN[w] for w in words])
        ios.append(TOKEN[io])
        ss.append(TOKEN[s])
    return IOIPrompts(torch.tensor(toks), torch.tensor(ios), torch.tensor(ss))


def lm_batch(prompts: IOIPrompts) -> Batch:
    """Teacher-forced LM batch of ``prompt + IO``; loss on every position."""
    full = torch.cat([prompts.tokens, prompts.io[:, None]], 1)
    tokens, targets = full[:, :-1], full[:, 1:]
    return Batch(tokens, targets, torch.ones_like(targets, dtype=torch.bool))


def logit_diff(logits: torch.Tensor, prompts: IOIPrompts, reduce: bool = True) -> torch.Tensor:
    """logit[IO] - logit[S] at the last position (mean over prompts when ``reduce``)."""
    last = logits[:, -1, :]
    idx = torch.arange(last.shape[0], device=last.device)
    d = last[idx, prompts.io.to(last.device)] - last[idx, prompts.s.to(last.device)]
    return d.mean() if reduce else d


def accuracy(logits: torch.Tensor, prompts: IOIPrompts) -> float:
    return float((logit_diff(logits, prompts, reduce=False) > 0).float().mean())


def gpt2_prompts(tokenizer, n: int, seed: int) -> IOIPrompts:
    """Paper B's GPT-2 prompts (IO != S), keeping single-token names, places, objects."""

    def one(word):
        ids = tokenizer.encode(" " + word, add_special_tokens=False)
        return ids[0] if len(ids) == 1 else None

    names = [w for w in NAMES if one(w) is not None]
    if len(names) < 2:
        raise ValueError("the tokenizer splits the IOI names; cannot build equal-length prompts")
    g = torch.Generator().manual_seed(seed)
    toks, ios, ss = [], [], []
    length = None
    tries = 0
    while len(toks) < n and tries < 50 * n:
        tries += 1
        a, b = torch.randperm(len(names), generator=g)[:2].tolist()
        p = PLACES[int(torch.randint(len(PLACES), (1,), generator=g))]
        o = OBJECTS[int(torch.randint(len(OBJECTS), (1,), generator=g))]
        text = GPT2_TEMPLATE.format(IO=names[a], S=names[b], P=p, O=o)
        ids = tokenizer.encode(text, add_special_tokens=False)
        if tokenizer.bos_token_id is not None:
            ids = [tokenizer.bos_token_id] + ids
        if length is None:
            length = len(ids)
        if len(ids) != length:
            continue
        toks.append(ids)
        ios.append(one(names[a]))
        ss.append(one(names[b]))
    return IOIPrompts(torch.tensor(toks), torch.tensor(ios), torch.tensor(ss))


# ----------------------------------------------------------------------------------
# Training a toy IOI model with attention-head dropout
# ----------------------------------------------------------------------------------
def head_dropout_logits_fn(p: float, n_heads: int, seed: int = 0):
    """A ``logits_fn`` for :func:`selfrepair.train.train` that zeroes each head's output
    independently with probability ``p`` (per example, layer and head) in training.

    GPT-2 only: a pre-hook on each block's ``attn.c_proj``, whose input is the
    concatenation of the heads' outputs z. No rescaling; at test time every head is
    present, so the model learns to tolerate missing heads (self-repair).
    Call :func:`remove_head_dropout` on the model after training.
    """
    g = torch.Generator().manual_seed(seed)

    def pre(module, args):
        m = getattr(module, "_sr_mask", None)
        if m is None or not module.training:
            return None
        x = args[0]
        b, t, d = x.shape
        m = m.to(x.device, x.dtype)
        return ((x.view(b, t, n_heads, d // n_heads) * m[:, None, :, None]).view(b, t, d),) + tuple(args[1:])

    def logits_fn(model, tokens):
        blocks = model.transformer.h
        if p > 0:
            masks = (torch.rand(len(blocks), tokens.shape[0], n_heads, generator=g) >= p).float()
            for i, block in enumerate(blocks):
                if not hasattr(block.attn.c_proj, "_sr_handle"):
                    block.attn.c_proj._sr_handle = block.attn.c_proj.register_forward_pre_hook(pre)
                block.attn.c_proj._sr_mask = masks[i]
        return model(input_ids=tokens).logits

    return logits_fn


def remove_head_dropout(model) -> None:
    for block in model.transformer.h:
        proj = block.attn.c_proj
        if hasattr(proj, "_sr_handle"):
            proj._sr_handle.remove()
            del proj._sr_handle
        proj._sr_mask = None


def train_toy(
    n_layers: int,
    n_heads: int,
    d_model: int,
    d_mlp: int,
    seed: int,
    head_dropout: float = 0.1,
    lr: float = 1e-3,
    batch_size: int = 64,
    max_steps: int = 3000,
    eval_every: int = 250,
    target_accuracy: float | None = None,
    device: str = "cpu",
):
    """Train a GPT-2 toy IOI model from scratch; returns (model, TrainResult)."""
    from ..models import build_gpt2_toy, gpt2_toy_config
    from ..train import train

    cfg = gpt2_toy_config(VOCAB, n_layers, n_heads, d_model, d_mlp, n_ctx=PROMPT_LEN + 1, bos_token_id=TOKEN[BOS])
    model = build_gpt2_toy(cfg, seed=seed, positional=True)
    val = sample_toy(256, seed=10_000 + seed)

    def batch_fn(step):
        return lm_batch(sample_toy(batch_size, seed=seed * 1_000_003 + step))

    def eval_fn(m):
        with torch.no_grad():
            return accuracy(m(input_ids=val.tokens.to(next(m.parameters()).device)).logits.cpu(), val)

    res = train(
        model,
        batch_fn,
        eval_fn,
        lr=lr,
        max_steps=max_steps,
        eval_every=eval_every,
        target_accuracy=target_accuracy,
        device=device,
        logits_fn=head_dropout_logits_fn(head_dropout, n_heads, seed),
    )
    remove_head_dropout(model)
    return model.eval(), res


# ----------------------------------------------------------------------------------
# Ground truth by brute force, and the experiments of paper B on one model
# ----------------------------------------------------------------------------------
def ablation_drops(bridge, prompts: IOIPrompts, sets, mode="zero", means=None, max_rows=2048) -> list[float]:
    """Logit-difference drop m(clean) - m(ablated) of each ablation set."""
    from ..interventions import run_ablated

    vals = run_ablated(bridge, prompts.tokens, [[]] + list(sets), mode, means,
                       reduce=lambda lg: float(logit_diff(lg.cpu(), prompts)), max_rows=max_rows)
    return [vals[0] - v for v in vals[1:]]


def ground_truth(bridge, prompts: IOIPrompts, heads, n_primary: int = 3, backup_frac: float = 0.1, max_rows=2048):
    """Every head's single ablation and every pair's joint ablation on the IOI metric.

    Primaries (name movers): the ``n_primary`` heads with the largest drop.
    Interaction I(u, v) = drop(u, v) - drop(u) - drop(v); a head h outside the
    primaries is a backup when max_p I(p, h) > ``backup_frac`` * max_p drop(p) (its
    ablation hurts far more once a primary is gone). Returns (heads table, pairs table,
    primaries, backups).
    """
    import pandas as pd

    heads = list(heads)
    single = ablation_drops(bridge, prompts, [[h] for h in heads], max_rows=max_rows)
    pairs = [(i, j) for i in range(len(heads)) for j in range(i + 1, len(heads))]
    joint = ablation_drops(bridge, prompts, [[heads[i], heads[j]] for i, j in pairs], max_rows=max_rows)
    inter = {}
    rows = []
    for (i, j), dj in zip(pairs, joint):
        val = dj - single[i] - single[j]
        inter[(i, j)] = inter[(j, i)] = val
        rows.append({"u": heads[i].name, "v": heads[j].name, "drop_u": single[i], "drop_v": single[j],
                     "drop_uv": dj, "interaction": val})
    order = sorted(range(len(heads)), key=lambda i: -single[i])
    prim = order[:n_primary]
    thr = backup_frac * max(single[p] for p in prim)
    table = []
    for i, h in enumerate(heads):
        beta = max((inter[(p, i)] for p in prim if p != i), default=float("nan"))
        table.append({"unit": h.name, "drop": single[i], "backup_score": beta,
                      "role": "primary" if i in prim else ("backup" if beta > thr else "other")})
    t = pd.DataFrame(table)
    primaries = [heads[i] for i in prim]
    backups = [heads[i] for i in range(len(heads)) if table[i]["role"] == "backup"]
    return t, pd.DataFrame(rows), primaries, backups


def _patched_drop(bridge, prompts, zero, freeze, clean_z):
    """Drop of the logit difference with ``zero`` heads zeroed and ``freeze`` heads held
    at their clean outputs (one forward)."""
    from ..interventions import make_hooks

    patch = {}
    for c in list(zero) + list(freeze):
        z = patch.setdefault(c.hook, clean_z[c.hook].clone())
        if c in zero:
            z[:, :, c.head, :] = 0.0
    hooks = make_hooks([list(zero) + list(freeze)], prompts.tokens.shape[0], "patch", patch)
    with torch.no_grad():
        m0 = float(logit_diff(bridge(prompts.tokens).cpu(), prompts))
        m = float(logit_diff(bridge.run_with_hooks(prompts.tokens, fwd_hooks=hooks).cpu(), prompts))
    return m0 - m


def run_ioi(
    bridge,
    prompts: IOIPrompts,
    heads,
    primaries,
    backups,
    protocol: str = "v2",
    top_r: int = 192,
    top_k: int = 20,
    k_recovered: int | None = None,
    wake_min: float = 1.05,
    ig_steps: int = 5,
    max_rows: int = 2048,
) -> dict:
    """Paper B's IOI experiments on one model and one prompt set.

    ``primaries`` seed COAX; ``backups`` are the positives (ground truth). Returns
    DataFrames: scores (per head), discovery (ROC-AUC and top-k recall per method),
    wake (wake-up curve), freeze, recovery and knockout, plus the forward-pass count.
    """
    import pandas as pd

    from .. import baselines, coax
    from ..stats import recall_at_k, roc_auc

    heads, primaries, backups = list(heads), list(primaries), list(backups)
    cands = [h for h in heads if h not in primaries]
    metric = lambda lg: logit_diff(lg, prompts)  # noqa: E731
    sc = coax.scan(bridge, prompts.tokens, cands, primaries, protocol, top_r, max_rows=max_rows)
    last = [prompts.tokens.shape[1] - 1]
    wake = coax.wake_up_ratios(bridge, prompts.tokens, cands, primaries, positions=last)
    table = baselines.all_scores(bridge, prompts.tokens, cands, metric, sc.table, ig_steps)
    table["wake"] = table["unit"].map(wake)
    bset = {b.name for b in backups}
    table["backup"] = table["unit"].isin(bset)
    disc = []
    for name, fn in baselines.DISCOVERY_METHODS.items():
        s = fn(table)
        ranked = list(table.assign(s=s).sort_values("s", ascending=False)["unit"])
        hit, share = recall_at_k(ranked, bset, top_k)
        disc.append({"method": name, "roc_auc": roc_auc(s, table["backup"]), "top_k": top_k,
                     "hits": hit, "n_backups": len(bset), "n_candidates": len(cands)})
    disc = pd.DataFrame(disc)

    # wake-up curve: backups vs the other candidates, 0..|S| primaries ablated
    others = [h for h in cands if h.name not in bset]
    wc = coax.wake_up_curve(bridge, prompts.tokens, primaries, cands, positions=last)
    wc["group"] = wc["unit"].map(lambda u: "backup" if u in bset else "other")

    # freezing the backups at their clean outputs
    _, cache = bridge.run_with_cache(prompts.tokens, names_filter=lambda n: n.endswith("hook_z"))
    clean_z = {k: v.detach().clone() for k, v in cache.items()}
    d_p = _patched_drop(bridge, prompts, primaries, [], clean_z)
    d_fb = _patched_drop(bridge, prompts, primaries, backups, clean_z)
    d_fa = _patched_drop(bridge, prompts, primaries, cands, clean_z)
    repair = d_fa - d_p
    freeze = pd.DataFrame([{
        "drop_primaries": d_p, "drop_backups_frozen": d_fb, "drop_all_frozen": d_fa,
        "repair_total": repair, "repair_removed_share": (d_fb - d_p) / repair if repair != 0 else float("nan"),
    }])

    # attribution recovery and knockout
    k = k_recovered if k_recovered is not None else max(1, len(backups))
    rec = [parse_name(u) for u in coax.recovered_set(sc.table, wake, k, wake_min)]
    own = [parse_name(u) for u in table.assign(s=table["single"]).sort_values("s", ascending=False)["unit"].head(k)]
    sets = {"clean": [], "primaries": primaries, "primaries+coax": primaries + rec,
            "primaries+ground_truth": primaries + backups, "primaries+own_topk": primaries + own}
    from ..interventions import run_ablated

    outs = run_ablated(bridge, prompts.tokens, list(sets.values()),
                       reduce=lambda lg: (float(logit_diff(lg.cpu(), prompts)), accuracy(lg.cpu(), prompts)),
                       max_rows=max_rows)
    m0 = outs[0][0]
    ko = pd.DataFrame([{"set": n, "size": len(s), "units": " ".join(c.name for c in s),
                        "logit_diff": o[0], "drop": m0 - o[0], "accuracy": o[1]}
                       for (n, s), o in zip(sets.items(), outs)])
    return {"scores": table, "discovery": disc, "wake": wc, "freeze": freeze, "knockout": ko,
            "forward_passes": sc.forward_passes, "recovered": [c.name for c in rec]}


def parse_name(name):
    from ..components import parse

    return parse(name)


# GPT-2 small's IOI circuit (Wang et al. 2022), as listed in SPEC.md
GPT2_NAME_MOVERS = ["L9H9", "L10H0", "L9H6"]
GPT2_BACKUP_NAME_MOVERS = ["L10H10", "L10H6", "L10H2", "L10H1", "L11H2", "L9H7", "L9H0", "L11H9"]
GPT2_NEGATIVE_NAME_MOVERS = ["L10H7", "L11H10"]
GPT2_S_INHIBITION = ["L7H3", "L7H9", "L8H6", "L8H10"]
GPT2_INDUCTION = ["L5H5", "L5H8", "L5H9", "L6H9"]
GPT2_DUPLICATE_TOKEN = ["L0H1", "L0H10", "L3H0"]
GPT2_PREVIOUS_TOKEN = ["L2H2", "L4H11"]
