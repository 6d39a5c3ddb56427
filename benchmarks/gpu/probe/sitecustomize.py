"""The GPU run's probe (benchmarks/gpu/gpu_bench.py puts this folder on PYTHONPATH): every
Python process of the run imports it at start-up; when one ends, it appends a JSON line
to $SELFREPAIR_GPU_PROBE: its pid, start and end time, the Snakemake rule and wildcards of
the job it ran (a ``script:`` job has the ``snakemake`` object in ``__main__``) and, where
it used CUDA, torch.cuda.max_memory_allocated / max_memory_reserved. It imports nothing
heavy (torch is looked up, never imported: the numerics pins must come first). Without
the variable it does nothing. Another sitecustomize further down sys.path still runs."""

import os
import sys


def _record(path: str, t0: float) -> None:
    import json
    import time

    smk = getattr(sys.modules.get("__main__"), "snakemake", None)
    torch = sys.modules.get("torch")
    rec = {"pid": os.getpid(), "start": t0, "end": time.time(), "rule": None, "wildcards": {}, "cuda": False}
    try:
        if smk is not None:
            rec["rule"] = str(smk.rule)
            rec["wildcards"] = {str(k): str(v) for k, v in smk.wildcards.items()}
        if torch is not None and torch.cuda.is_initialized():
            rec["cuda"] = True
            rec["max_allocated"] = int(torch.cuda.max_memory_allocated())
            rec["max_reserved"] = int(torch.cuda.max_memory_reserved())
    except Exception as err:  # the record says what failed; the job's own exit status stands
        rec["error"] = f"{type(err).__name__}: {err}"
    if rec["rule"] is None and not rec["cuda"]:
        return  # not a job (pip, snakemake itself, a helper)
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


def _chain() -> None:
    """Run the sitecustomize this one shadows, if any."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if os.environ.get("SELFREPAIR_GPU_PROBE"):
    import atexit
    import time

    atexit.register(_record, os.environ["SELFREPAIR_GPU_PROBE"], time.time())
_chain()
