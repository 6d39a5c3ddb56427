"""Every model a run trained, with the SHA-256 of its weights, and a check that the code
trains them again.

    .venv/bin/python scripts/models_manifest.py write [--directory .] [--configfile config/config.yaml ...]
        [--out results/reference/models.csv]
    .venv/bin/python scripts/models_manifest.py verify PATTERN [--manifest results/reference/models.csv]
        [--keep DIR] [--cores 2]
    make verify MODEL=results/heroes/sort/seed42          # the same, from the Makefile
    .venv/bin/python scripts/models_manifest.py provenance TABLE.csv ... [--directory .]

``write`` lists every model folder below ``<directory>/results`` (the folder above a
``model/model.safetensors``: results/heroes/sort/seed42, results/coax/ioi/seed1, ...) with
the SHA-256 of its weights, the numerics mode, CPU vendor and CPU that trained it (the
record its training job saved), and the config files of the run (``make reference``
writes results/reference/models.csv this way).

``verify`` retrains each model whose folder matches PATTERN (an fnmatch pattern: a
folder, or e.g. ``results/heroes/sort/*``) in a fresh temporary folder, with the run's
config files and its numerics mode, and compares the bits. It says first whether the same
bits are expected on this machine, and why: under ``exact`` and ``fast`` on an x86-64 CPU
with AVX2 of the vendor that trained it, and on another vendor's only where the committed
fingerprints (benchmarks/fingerprints/) show both vendors training the same bits under
that mode (under ``fast`` they do, under ``exact`` not); under ``native`` only on that
machine. It exits 1 when an expected match fails, 0 otherwise (a mismatch that the mode
does not promise to avoid is reported, not failed).

``provenance`` records, for each reference table named, the numerics mode, CPU vendor and
CPU of the run that wrote it (its models' records, which must agree), the commit and the
date, in results/reference/numerics.csv; rows of tables not named stay as they are.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from selfrepair.core import numerics  # noqa: E402  imports no torch
from selfrepair.core.runtime import sha256_file as sha256  # noqa: E402  stdlib only

COLUMNS = ["model", "sha256", "numerics", "cpu_vendor", "cpu", "configfiles"]


def model_dirs(directory: Path) -> list[Path]:
    """Every trained-model folder below directory/results (the parent of model/)."""
    return sorted(p.parent.parent for p in (directory / "results").rglob("model/model.safetensors"))


def training_record(folder: Path) -> dict:
    """The numerics record saved by the model's training job: train.json (paper A) or the
    model's selfrepair.json (every model save_model writes)."""
    for f in (folder / "train.json", folder / "model" / "selfrepair.json"):
        if f.exists():
            rec = json.loads(f.read_text()).get("numerics")
            if rec:
                return rec
    raise SystemExit(f"{folder}: no numerics record in train.json or model/selfrepair.json")


def manifest(directory: Path, configfiles: list[str]):
    import pandas as pd

    rows = []
    for m in model_dirs(directory):
        rec = training_record(m)
        rows.append({"model": str(m.relative_to(directory)), "sha256": sha256(m / "model" / "model.safetensors"),
                     "numerics": rec.get("mode", "unrecorded"), "cpu_vendor": rec.get("cpu_vendor", "unrecorded"),
                     "cpu": rec.get("cpu", ""), "configfiles": " ".join(configfiles)})  # fmt: skip
    if not rows:
        raise SystemExit(f"no trained models below {directory / 'results'}")
    return pd.DataFrame(rows, columns=COLUMNS)


def cross_vendor_evidence(mode: str) -> dict:
    """What the committed fingerprints show for ``mode`` across CPU vendors
    (benchmarks/fingerprint.py's ``cross_vendor``)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fingerprint  # stdlib only at import

    return fingerprint.cross_vendor(fingerprint.committed(), mode)


def expectation(row, evidence=None) -> tuple[bool, str]:
    """Whether this machine should get the row's bits back, and why. ``evidence``: the
    committed fingerprints' cross-vendor verdict for the row's mode (read when needed)."""
    mode, vendor, mine = row["numerics"], row["cpu_vendor"], numerics.cpu_vendor()
    if mode not in numerics.PINNED_MODES:
        return False, f"{mode} mode: the same bits only on the machine that trained it"
    if not numerics.can_pin():
        return False, f"{mode} mode, but this CPU lacks AVX2/FMA: the pinned kernels cannot run here"
    if vendor == mine:
        return True, f"{mode} mode: the same bits on x86-64 CPUs with AVX2 of one vendor, and this CPU is {vendor} too"
    ev = evidence if evidence is not None else cross_vendor_evidence(mode)
    if ev["training_same"] and {vendor, mine} <= set(ev["vendors"]):
        return True, (f"{mode} mode trained it on a {vendor} CPU, this one is {mine}: the committed fingerprints of "
                      "both vendors train the same bits under it (benchmarks/fingerprints/)")  # fmt: skip
    why = ("the committed fingerprints show the two vendors training other bits under it"
           if ev["training_same"] is False else "no committed fingerprint shows both vendors training the same bits")  # fmt: skip
    return False, (
        f"{mode} mode trained it on a {vendor} CPU; this one is {mine}: {why} (benchmarks/fingerprints/, "
        "README 'Numerics'), so other bits are expected; the same claims within their CIs"
    )


def retrain(folder: str, configfiles: list[str], mode: str, workdir: Path, cores: int) -> Path:
    """Train one model folder in ``workdir`` with the Snakefile of this checkout."""
    (workdir / "config").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "config" / "published.yaml", workdir / "config" / "published.yaml")
    cmd = [str(Path(sys.executable).parent / "snakemake"), "-s", str(ROOT / "Snakefile"), "--cores", str(cores),
           "--directory", str(workdir), "--configfile", *[str(ROOT / c) for c in configfiles],
           "--config", f"numerics={mode}", "device=cpu", "--", f"{folder}/model"]  # fmt: skip
    r = subprocess.run(cmd, env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"retraining {folder} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return workdir / folder / "model" / "model.safetensors"


def verify(pattern: str, manifest_file: Path, keep: Path | None, cores: int) -> int:
    import pandas as pd

    if not manifest_file.exists():
        raise SystemExit(f"{manifest_file} does not exist: `make reference` writes it after a full run")
    rows = pd.read_csv(manifest_file)
    missing = set(COLUMNS) - set(rows.columns)
    if missing:
        raise SystemExit(f"{manifest_file}: missing columns {sorted(missing)}")
    pick = rows[[fnmatch.fnmatch(m, pattern) or fnmatch.fnmatch(m, pattern.rstrip("/")) for m in rows["model"]]]
    if pick.empty:
        raise SystemExit(f"no model of {manifest_file} matches {pattern!r} (e.g. {rows['model'].iloc[0]})")
    failed = 0
    for _, row in pick.iterrows():
        expected, why = expectation(row)
        print(f"{row['model']}: trained under {row['numerics']} on {row['cpu_vendor']} ({row['cpu']})")
        print(f"  {'expect the same bits' if expected else 'not expected to match'}: {why}")
        work = Path(tempfile.mkdtemp(prefix="verify-", dir=keep))
        t0 = time.perf_counter()
        got = sha256(retrain(row["model"], row["configfiles"].split(), row["numerics"], work, cores))
        same = got == row["sha256"]
        print(f"  retrained in {time.perf_counter() - t0:.0f} s on {numerics.cpu_model()} ({numerics.cpu_vendor()})")
        print(f"  reference {row['sha256']}\n  retrained {got}\n  {'SAME BITS' if same else 'DIFFERENT BITS'}")
        if expected and not same:
            failed += 1
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{len(pick)} model(s) retrained, {failed} expected match(es) failed")
    return 1 if failed else 0


PROVENANCE_COLUMNS = ["table", "numerics", "cpu_vendor", "cpu", "commit", "date"]


def run_numerics(directory: Path) -> dict:
    """The one numerics mode, CPU vendor and CPU that trained every model of a run."""
    recs = {(r.get("mode"), r.get("cpu_vendor", "unrecorded"), r.get("cpu", "")) for r in
            (training_record(m) for m in model_dirs(directory))}  # fmt: skip
    if len(recs) != 1:
        raise SystemExit(f"the run in {directory} mixes numerics records {sorted(recs)}: no single provenance")
    mode, vendor, cpu = recs.pop()
    return {"numerics": mode, "cpu_vendor": vendor, "cpu": cpu}


def _committed_unchanged(path: Path) -> bool:
    """Whether git tracks ``path`` and it equals the committed file (HEAD)."""
    where = dict(cwd=path.parent, capture_output=True)
    tracked = subprocess.run(["git", "ls-files", "--error-unmatch", path.name], **where).returncode == 0
    return tracked and subprocess.run(["git", "diff", "--quiet", "HEAD", "--", path.name], **where).returncode == 0


def provenance(tables: list[str], directory: Path, out: Path) -> None:
    import pandas as pd

    rec = run_numerics(directory)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    new = pd.DataFrame([{"table": Path(t).name, **rec, "commit": commit.stdout.strip() or "unknown",
                         "date": time.strftime("%Y-%m-%d")} for t in tables], columns=PROVENANCE_COLUMNS)  # fmt: skip
    old = pd.read_csv(out) if out.exists() else pd.DataFrame(columns=PROVENANCE_COLUMNS)
    # a named table whose bytes git has committed unchanged keeps its row: copying the same
    # table again (a partial rerun, then `make reference`) does not restamp it
    kept = {t for t in new["table"] if t in set(old["table"]) and _committed_unchanged(out.parent / t)}
    new = new[~new["table"].isin(kept)]
    old = old[~old["table"].isin(new["table"])]
    both = pd.concat([d for d in (old, new) if not d.empty], ignore_index=True)
    both.sort_values("table").to_csv(out, index=False)
    print(
        f"provenance of {len(new)} tables ({rec['numerics']}, {rec['cpu_vendor']}) written to {out}; "
        f"{len(kept)} unchanged since the last commit kept their rows"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="list a run's models with their hashes")
    w.add_argument("--directory", default=".", help="the run's working directory")
    w.add_argument("--configfile", nargs="+", default=["config/config.yaml"], help="the run's config files")
    w.add_argument("--out", default="results/reference/models.csv")
    v = sub.add_parser("verify", help="retrain the models matching a pattern and compare their bits")
    v.add_argument("pattern", help="a model folder (results/heroes/sort/seed42) or an fnmatch pattern")
    v.add_argument("--manifest", default=str(ROOT / "results" / "reference" / "models.csv"))
    v.add_argument("--keep", help="keep the retraining folders under this folder")
    v.add_argument("--cores", type=int, default=2)
    p = sub.add_parser("provenance", help="record the numerics mode and CPU vendor of reference tables")
    p.add_argument("tables", nargs="+", help="the reference tables this run wrote")
    p.add_argument("--directory", default=".", help="the run's working directory")
    p.add_argument("--out", default="results/reference/numerics.csv")
    a = ap.parse_args()
    if a.cmd == "provenance":
        provenance(a.tables, Path(a.directory), Path(a.out))
        return
    if a.cmd == "write":
        table = manifest(Path(a.directory), a.configfile)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(a.out, index=False)
        print(f"{len(table)} models written to {a.out}")
        return
    keep = Path(a.keep) if a.keep else None
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
    sys.exit(verify(a.pattern, Path(a.manifest), keep, a.cores))


if __name__ == "__main__":
    main()
