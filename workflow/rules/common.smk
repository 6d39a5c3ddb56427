# Shared helpers: config validation, code hashing, target registry.
import hashlib
from pathlib import Path

from snakemake.utils import validate


validate(config, "../schemas/config.schema.yaml")

SRC = Path(workflow.basedir) / "src" / "selfrepair"
PAPERS = list(config["papers"])
DEVICE = config["device"]
TARGETS = {}  # paper -> list of final files, filled by each paper's rule file


def code_hash(*modules):
    """Hash of library modules (paths under src/selfrepair, without .py).

    Passed through params:, so that editing the library code a rule uses reruns it.
    """
    h = hashlib.sha256()
    for m in sorted(modules):
        f = SRC / f"{m}.py"
        if not f.exists():
            raise WorkflowError(f"code_hash: no library module {f}")
        h.update(m.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def register(paper, files):
    TARGETS.setdefault(paper, []).extend(files)


def all_targets():
    out = []
    for p in PAPERS:
        out.extend(TARGETS.get(p, []))
    out.append("results/published/summary.csv")
    return out
