"""MIB's memory plan (:mod:`selfrepair.gim.memory`) against measurement, and the table of
needs per model and MIB method.

``--measure``: for each model named, the random-weight real-width stand-in of
``real_size.py`` (``--max-heads`` caps its layers), one MIB job per method in a fresh
process (``run_mib`` on the stand-in IOI dataset, float32 on the CPU, ``--n`` pairs in one
batch), its peak resident memory (``ru_maxrss``, the true peak of the process) beside
the plan's total. Rows go to ``--out`` (results/benchmarks/mib_memory.csv; rows of other
models, methods and sizes are kept; ``--write`` also to
results/reference/benchmark_mib_memory.csv)::

    python benchmarks/mib_memory.py --measure --models gpt2 --methods eap --n 8

``--table``: per model (full depth) and method, the plan in MIB's precision on a GPU at
batch 1 and 20 and which GPU sizes hold it (docs/MIB.md's table)::

    python benchmarks/mib_memory.py --table --positions 32

``--precision``: how far bfloat16 moves CPR and CMD from float32 on each stand-in named
(``run_mib`` in both dtypes, same pairs); rows to mib_precision.csv beside ``--out`` (other
models' rows kept; ``--write``: results/reference/benchmark_mib_precision.csv).
"""

from __future__ import annotations

import importlib.util
import json
import resource
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import harness  # noqa: E402

MODELS = ["gpt2", "Qwen/Qwen2.5-0.5B", "google/gemma-2-2b", "meta-llama/Llama-3.1-8B"]
METHODS = ["eap", "eap-ig", "gim", "relp", "eap-gp", "ifr"]
MODEL_TYPE = {"GPT2Config": "gpt2", "Qwen2Config": "qwen2", "Gemma2Config": "gemma2", "LlamaConfig": "llama"}
GPUS_GB = (24, 40, 80, 141)
TOLERANCE = 0.25  # the plan within 25% of the measured peak


def real_size():
    spec = importlib.util.spec_from_file_location("real_size", ROOT / "benchmarks" / "real_size.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def shape_of(name: str, layers: int | None = None):
    """The plan's Shape of a model of ``real_size.CONFIGS`` (``layers``: a stand-in's)."""
    from selfrepair.gim.memory import Shape

    rs = real_size()
    cls_name, kw = rs.CONFIGS[name]
    return Shape.from_config({"model_type": MODEL_TYPE[cls_name], **(rs.with_layers(kw, layers) if layers else kw)})


def child(folder: str, data: str, method: str, n: int) -> None:
    """One MIB job in this process; prints its status row and peak RSS as JSON."""
    import logging

    from selfrepair.gim.localization import run_mib

    logging.basicConfig(level=logging.WARNING)
    status, table, _ = run_mib([folder], ["ioi"], [method], n, [data], batch_size=n, ig_steps=5, fractions=(0.5, 1.0),
                               weighting="mib", dtype="float32")  # fmt: skip
    row = status.iloc[0].to_dict()
    row["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux: kB
    print("RESULT " + json.dumps({k: (v if isinstance(v, str) else float(v)) for k, v in row.items()}, default=str))


def measure(args) -> list[dict]:
    """The stand-ins built, one fresh process per (model, method), rows for --out."""
    from selfrepair.gim import memory

    rs = real_size()
    root = Path(args.root)
    rs.write_mib_datasets(root / "mib")
    rows = []
    for name in args.models:
        info = rs.build(name, root, float("inf"), args.max_heads)
        folder = str(Path(info["models_root"]) / name)
        config = json.loads((Path(folder) / "config.json").read_text())
        for method in args.methods:
            cmd = [sys.executable, __file__, "--child", folder, str(root / "mib"), method, str(args.n)]
            r = subprocess.run(cmd, capture_output=True, text=True)
            got = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
            if r.returncode or not got:
                raise SystemExit(f"{name} {method} failed:\n{r.stderr[-3000:]}")
            res = json.loads(got[0][7:])
            shape = memory.Shape.from_config(config)
            positions = int(_positions(folder, root / "mib", args.n))
            p = memory.plan(shape, method, args.n, positions, "float32", "cpu", False, "float32")
            rows.append({"model": name, "layers_built": info["layers_built"], "method": method, "n": args.n,
                         "batch": args.n, "positions": positions, "status": res["status"],
                         "planned_gb": round(p["total"] / 1e9, 3), "peak_rss_gb": round(res["peak_rss_gb"], 3),
                         "ratio": round(p["total"] / 1e9 / res["peak_rss_gb"], 3), "machine": harness.machine(),
                         "commit": harness.commit(), "plan": memory.describe(p)})  # fmt: skip
            print(rows[-1], flush=True)
    return rows


def precision_rows(args) -> list[dict]:
    """CPR and CMD of each method in float32 and bfloat16 on each stand-in, and their
    differences (bfloat16 - float32)."""
    from selfrepair.gim.localization import run_mib

    rs = real_size()
    root = Path(args.root)
    rs.write_mib_datasets(root / "mib")
    rows = []
    for name in args.models:
        info = rs.build(name, root, float("inf"), args.max_heads)
        folder = str(Path(info["models_root"]) / name)
        got = {}
        for dtype in ("float32", "bfloat16"):
            _, table, _ = run_mib([folder], ["ioi"], args.methods, args.n, [str(root / "mib")], batch_size=args.n,
                                  fractions=(0.01, 0.05, 0.1, 0.2, 0.5, 1.0), weighting="mib", dtype=dtype)  # fmt: skip
            got[dtype] = table.set_index("method")
        for m in args.methods:
            f, b = got["float32"].loc[m], got["bfloat16"].loc[m]
            rows.append({"model": name, "layers_built": info["layers_built"], "method": m, "n": args.n,
                         "cpr_float32": f.cpr, "cpr_bfloat16": b.cpr, "cpr_moved": b.cpr - f.cpr,
                         "cmd_float32": f.cmd, "cmd_bfloat16": b.cmd, "cmd_moved": b.cmd - f.cmd,
                         "commit": harness.commit()})  # fmt: skip
            print(rows[-1], flush=True)
    return rows


def _positions(folder: str, data: Path, n: int) -> int:
    from selfrepair.core.models import folder_tokenizer
    from selfrepair.tasks import mib

    return mib.load("ioi", folder_tokenizer(folder, None), n, [str(data)]).clean.shape[1]


def needs_table(positions: int) -> pd.DataFrame:
    """Per model (full depth) and method: the GPU plan in MIB's precision at batch 1 and
    20 (GB) and the GPU sizes that hold batch 1 and batch 20 with the plan's margin."""
    from selfrepair.gim import memory, precision

    rows = []
    for name in MODELS:
        shape = shape_of(name)
        dtype = precision.mib_dtype(MODEL_TYPE[real_size().CONFIGS[name][0]])
        for method in METHODS:
            one, twenty = (memory.plan(shape, method, b, positions, dtype, "cuda")["total"] / 1e9 for b in (1, 20))
            fits = {b: [g for g in GPUS_GB if v <= g * (1 - memory.MARGIN)] for b, v in ((1, one), (20, twenty))}
            rows.append({"model": name, "method": method, "dtype": dtype, "batch1_gb": round(one, 1),
                         "batch20_gb": round(twenty, 1), "gpus_batch1": " ".join(map(str, fits[1])) or "none",
                         "gpus_batch20": " ".join(map(str, fits[20])) or "none"})  # fmt: skip
    return pd.DataFrame(rows)


def main(argv=None):
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    ap = harness.arguments(__doc__, "mib_memory.csv", threads=None, modes=False)
    ap.add_argument("--measure", action="store_true")
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--precision", action="store_true")
    ap.add_argument("--models", nargs="*", default=MODELS)
    ap.add_argument("--methods", nargs="*", default=["eap"])
    ap.add_argument("--n", type=int, default=8, help="pairs, in one batch")
    ap.add_argument("--max-heads", type=int, default=None, help="cap a stand-in's layers at this many heads")
    ap.add_argument("--positions", type=int, default=32, help="--table: tokens per prompt")
    ap.add_argument("--root", default=str(Path.home() / ".cache/selfrepair/real_size"))
    args = ap.parse_args(argv)
    if args.table:
        print(needs_table(args.positions).to_markdown(index=False))
    if args.measure:
        harness.write(pd.DataFrame(measure(args)), args, keys=["model", "method", "n"])
    if args.precision:
        out = Path(args.out).with_name("mib_precision.csv")
        harness.write(pd.DataFrame(precision_rows(args)), args, out=out, keys=["model"])  # other models' rows kept


if __name__ == "__main__":
    main()
