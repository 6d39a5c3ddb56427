"""IOI on real LMs with and without a BOS first: which convention each model needs.

For each model folder: paper B's IOI prompts (``ioi.gpt2_prompts``, the release's
drawing, style "authors") tokenized by the checkpoint's own tokenizer
(``models.checkpoint_tokenizer``), run through the bridge as the tokenizer gives them,
with the tokenizer's BOS first and without it. Prints, per model and variant, whether
it is what the tokenizer's own call gives, the prompts' length, the accuracy
(share of prompts with logit[IO] > logit[S] at the last position) and the mean logit
difference, and which of the release's names are one token (with the leading space).

    python benchmarks/ioi_bos.py FOLDER [FOLDER ...] [--n 100] [--seeds 0]

Writes results/benchmarks/ioi_bos.csv (--out), one row per model x seed x variant.
"""

from __future__ import annotations

import harness

NUMERICS = harness.configure()  # before torch is imported

import pandas as pd  # noqa: E402
import torch  # noqa: E402

from selfrepair.core.models import checkpoint_tokenizer, load_bridge  # noqa: E402
from selfrepair.tasks import ioi  # noqa: E402


def variants(prompts: ioi.IOIPrompts, bos: int) -> dict:
    """The prompts with the tokenizer's BOS first and without it (one of the two is what
    the tokenizer's call gives)."""
    t = prompts.tokens
    bare = t[:, 1:] if bool((t[:, 0] == bos).all()) else t
    return {"with BOS": torch.cat([torch.full((t.shape[0], 1), bos), bare], 1), "without BOS": bare}


def measure(folder: str, n: int, seeds: list[int]) -> list[dict]:
    """One row per seed and variant of ``n`` prompts on the model in ``folder``."""
    tok = checkpoint_tokenizer(folder)
    bridge = load_bridge(folder)
    single = ioi.single_token_names(tok)
    split = sorted(set(ioi.NAMES) - set(single))
    print(f"{folder}: {type(tok).__name__}, BOS {tok.bos_token!r} ({tok.bos_token_id}); its call adds BOS: "
          f"{ioi.adds_bos(tok)}; one-token names {len(single)}/{len(ioi.NAMES)}{' split: ' if split else ''}"
          f"{', '.join(split)}")  # fmt: skip
    rows = []
    for seed in seeds:
        prompts = ioi.gpt2_prompts(tok, n, seed)
        for what, tokens in variants(prompts, tok.bos_token_id).items():
            row = {"model": folder, "seed": seed, "n": n, "prompts": what, "length": tokens.shape[1],
                   "as_tokenizer": (what == "with BOS") == ioi.adds_bos(tok)} | scores(bridge, prompts, tokens)  # fmt: skip
            rows.append(row)
            own = "  (the tokenizer's own)" if row["as_tokenizer"] else ""
            print(f"  seed {seed} {what:12s} length {row['length']:2d}  accuracy {row['accuracy']:.2f}  "
                  f"mean logit diff {row['logit_diff']:.2f}{own}", flush=True)  # fmt: skip
    return rows


def scores(bridge, prompts: ioi.IOIPrompts, tokens) -> dict:
    """Accuracy and mean logit difference of ``prompts``' IO and S on ``tokens``."""
    with torch.no_grad():
        logits = bridge(tokens)
    d = ioi.logit_diff(logits, ioi.IOIPrompts(tokens, prompts.io, prompts.s), reduce=False)
    return {"accuracy": float((d > 0).float().mean()), "logit_diff": float(d.mean())}


def main(argv=None):
    ap = harness.arguments(__doc__, "ioi_bos.csv")
    ap.add_argument("folders", nargs="+", help="model folders (float32 safetensors with their tokenizer)")
    ap.add_argument("--n", type=int, default=100, help="prompts per seed")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    a = ap.parse_args(argv)
    harness.start(a)
    rows = [r for f in a.folders for r in measure(f, a.n, a.seeds)]
    harness.write(pd.DataFrame(rows), a)


if __name__ == "__main__":
    main()
