"""Forward passes and seconds per COAX scan and per baseline on a toy IOI model.

    python benchmarks/bench_coax.py [MODEL_FOLDER] [--prompts 96] [--threads 1] [--write]

MODEL_FOLDER defaults to results/coax/ioi/seed1/model (written by the workflow); when
it is absent a toy IOI model is trained here first (about a minute). Forward and
backward passes are counted by a hook on the bridge's embedding, in prompt-set units
(one pass = every prompt once), so batched ablations count by the rows they run. The
table goes to results/benchmarks/coax.csv (--out; --write: also results/reference/).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import harness

NUMERICS = harness.configure()  # before torch is imported

import pandas as pd  # noqa: E402

from selfrepair.coax import baselines, ioi_experiment  # noqa: E402
from selfrepair.coax import score as coax  # noqa: E402
from selfrepair.core.components import head_components  # noqa: E402
from selfrepair.core.models import load_bridge, save_model  # noqa: E402
from selfrepair.tasks import ioi  # noqa: E402


def main(argv=None):
    ap = harness.arguments(__doc__, "coax.csv")
    ap.add_argument("model", nargs="?", default="results/coax/ioi/seed1/model")
    ap.add_argument("--prompts", type=int, default=96)
    ap.add_argument("--protocol", default="v2")
    a = ap.parse_args(argv)
    harness.start(a)
    folder = Path(a.model)
    if not (folder / "config.json").exists():
        folder = Path(tempfile.mkdtemp()) / "ioi"
        print(f"no model at {a.model}; training a toy IOI model (4 layers x 8 heads, 600 steps) into {folder}")
        model, _ = ioi_experiment.train_toy(4, 8, 64, 256, seed=1, max_steps=600)
        save_model(model, folder)
    b = load_bridge(folder)
    prompts = ioi.sample_toy(a.prompts, 11)
    heads = head_components(b.cfg.n_layers, b.cfg.n_heads)
    truth = ioi_experiment.ablation_drops(b, prompts, [[h] for h in heads])
    prim = [heads[i] for i in sorted(range(len(heads)), key=lambda i: -truth[i])[:3]]
    cands = [h for h in heads if h not in prim]
    rows = []
    b.embed.register_forward_pre_hook(
        lambda m, args, kw: rows.append((args[0] if args else next(iter(kw.values()))).shape[0]), with_kwargs=True
    )
    metric = lambda lg: ioi.logit_diff(lg, prompts)  # noqa: E731
    jobs = {
        f"COAX scan ({a.protocol}, |U|={len(cands)}, |S|={len(prim)})": lambda: coax.scan(
            b, prompts.tokens, cands, prim, a.protocol
        ),
        "single-ablation energy": lambda: coax.single_energies(b, prompts.tokens, cands, a.protocol),
        "AtP": lambda: baselines.atp(b, prompts.tokens, cands, metric),
        "EAP-IG (5 steps)": lambda: baselines.eap_ig(b, prompts.tokens, cands, metric, 5),
        f"AtP* GradDrop ({b.cfg.n_layers} layers)": lambda: baselines.atp_star_graddrop(
            b, prompts.tokens, cands, metric
        ),
        "AtP, mean |per prompt| (atp_mag)": lambda: baselines.atp_mag(b, prompts.tokens, cands, metric),
        "conditional gradient (cond_grad)": lambda: baselines.cond_grad(b, prompts.tokens, cands, prim, metric),
        "two-state AtP* (atp_star_2s, both states)": lambda: baselines.atp_star_2s(
            b, prompts.tokens, cands, prim, metric
        ),
    }
    print(
        f"model {folder}: {b.cfg.n_layers} layers x {b.cfg.n_heads} heads, {a.prompts} prompts, {a.threads} thread(s)"
    )
    print(f"{'method':45s} {'forward passes':>15s} {'forward calls':>14s} {'seconds':>9s}")
    table = []
    for name, fn in jobs.items():
        fn()  # warm-up
        rows.clear()
        _, dt = harness.timed(fn)
        table.append({"method": name, "forward_passes": sum(rows) / a.prompts, "forward_calls": len(rows),
                      "seconds": dt, "prompts": a.prompts, "threads": a.threads, "model": str(folder)})  # fmt: skip
        print(f"{name:45s} {sum(rows) / a.prompts:15.1f} {len(rows):14d} {dt:9.3f}")
    print(f"expected COAX passes: 2 + 2|U| = {2 + 2 * len(cands)} (1 clean, |U| single, 1 with S, |U| with S+u)")
    harness.write(pd.DataFrame(table), a)


if __name__ == "__main__":
    main()
