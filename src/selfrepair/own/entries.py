"""The ``own:`` config section without torch: what each analysis needs of its task, the
checks made when the workflow is parsed, and the fingerprint of a dataset file.

An entry names a model (a local folder or a name in the local Hugging Face cache), a
task (a built-in task name, or a local dataset file: MIB's row format or the plain
``clean``/``corrupt``/``answer``/``foil`` format, :mod:`selfrepair.own.data`) and the
analyses to run on them (:data:`KINDS`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

KINDS = ("edges", "shapley", "coax", "g_vs_c")
COUNTERFACTUAL_TASKS = ("ioi", "mcqa", "arithmetic")  # tasks.registry's pairs (classify is no pair task)
SEQUENCE_TASKS = ("reverse", "sort")  # paper A's (tasks.sequences.TASKS)
FILE_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
# the tables each analysis writes under results/own/<name>/<kind>/ (beside status.csv)
TABLES = {
    "edges": ("localization", "curves", "edges"),
    "shapley": ("shapley", "interactions", "scores", "agreement"),
    "coax": ("scores",),
    "g_vs_c": ("g_vs_c",),
}
# the files the section writes beside its entries' folders (results/own/<name>/,
# logs/own/<name>/): an entry of one of these names would put its folder inside a file
SECTION_FILES = {"status.csv": "results/own/status.csv", "status.log": "logs/own/status.log"}
EMPTY = (
    "results/own/status.csv: the own: config section is empty, so there is no analysis to gather. "
    "Give the config file that holds your entries after config/config.yaml, as in "
    "--configfile config/config.yaml config/own.yaml (docs/OWN_MODEL.md)"
)
STATUS_COLUMNS = ["name", "analysis", "status", "reason", "model", "folder", "identity", "task", "dataset_sha256"]


def fill_defaults(entries: list[dict], schema: dict) -> list[dict]:
    """Each entry with the defaults of the schema's item properties filled in (Snakemake's
    ``validate`` fills in the defaults of objects, not of a list's items)."""
    import copy

    props = schema["items"]["properties"]
    for e in entries:
        for k, v in props.items():
            if "default" in v:
                e.setdefault(k, copy.deepcopy(v["default"]))
    return entries


def task_kind(task: str) -> str:
    """``counterfactual`` (a built-in pair task), ``sequence`` (paper A's) or ``file``."""
    if task in COUNTERFACTUAL_TASKS:
        return "counterfactual"
    if task in SEQUENCE_TASKS:
        return "sequence"
    return "file"


def problems(entries: list[dict]) -> list[str]:
    """What the schema cannot say about the ``own`` entries, one line each, naming the key:
    an analysis that the task cannot feed (G vs C needs one of paper A's sequence tasks;
    the others need counterfactual pairs), a task that is neither a built-in name nor a
    dataset file's name, a seed set given to an entry that runs no COAX scan, a name that
    is one of the files the section writes (:data:`SECTION_FILES`)."""
    out = []
    for i, e in enumerate(entries):
        where = f"own.{i} ({e.get('name')})"
        kind = task_kind(e["task"])
        if e.get("name") in SECTION_FILES:
            out.append(
                f"{where}.name: {e['name']!r} is the name of the section's own file {SECTION_FILES[e['name']]}, "
                f"where the entry's folder would go: give the entry another name"
            )
        for a in e["analyses"]:
            if a == "g_vs_c" and kind != "sequence":
                out.append(
                    f"{where}.analyses: g_vs_c is paper A's G against C on a sequence task; task "
                    f"{e['task']!r} is not one of {', '.join(SEQUENCE_TASKS)} (drop g_vs_c, or add an entry "
                    "with a sequence task)"
                )
            elif a != "g_vs_c" and kind == "sequence":
                out.append(
                    f"{where}.analyses: {a} needs counterfactual pairs; {e['task']!r} is paper A's sequence "
                    f"task: give a built-in pair task ({', '.join(COUNTERFACTUAL_TASKS)}) or a dataset file"
                )
        if kind == "file" and Path(e["task"]).suffix not in FILE_SUFFIXES and not Path(e["task"]).is_dir():
            out.append(
                f"{where}.task: {e['task']!r} is neither a built-in task ({', '.join(COUNTERFACTUAL_TASKS + SEQUENCE_TASKS)}) "
                f"nor a dataset file (*{', *'.join(FILE_SUFFIXES)}) or a MIB dataset folder"
            )
    return out


def dataset_sha256(task: str) -> str:
    """SHA-256 (first 16 hex digits) of a dataset file's bytes (of a folder: of each
    file, by name); the task's own name for a built-in task; "" when absent."""
    if task_kind(task) != "file":
        return f"built-in:{task}"
    p = Path(task).expanduser()
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else []
    if not files:
        return ""
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.relative_to(p) if p.is_dir() else f.name}\0".encode())
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:16]


def presence(task: str) -> str:
    """A dataset file's size and modification time (a folder's files'), or 'absent': the
    rules rerun an analysis when its data change."""
    p = Path(task).expanduser()
    if task_kind(task) != "file":
        return task
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else []
    return " ".join(f"{f}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files) or f"{task}: absent"


def lost_models(entries: list[dict], root: str | Path = "results/own") -> list[str]:
    """One line per entry whose .gguf is gone, and the folder converted from it too, while
    its finished results (a status row that ran on that model) are there: a rerun would
    replace them by "not run" rows, so the run stops at parse, naming both and the ways out."""
    import csv

    from selfrepair.core.local_files import gguf_key, is_gguf_path

    out = []
    for i, e in enumerate(entries):
        model = str(e.get("model", ""))
        if not is_gguf_path(model) or gguf_key(model, e.get("search_paths") or []) is not None:
            continue
        for kind in e.get("analyses", []):
            f = Path(root) / str(e["name"]) / kind / "status.csv"
            try:
                rows = list(csv.DictReader(f.open(newline=""))) if f.is_file() else []
            except (OSError, csv.Error, UnicodeDecodeError):
                rows = []
            ran = [r for r in rows if r.get("status") == "ran" and r.get("model") == model]
            if ran:
                out.append(
                    f"own.{i}.model ({e['name']}): {model} is gone, and so is {ran[0].get('folder') or 'the folder'} "
                    f"converted from it, while {f.parent} holds results made from it, which a rerun would replace "
                    f"by a not-run row. Put the file back, or delete {Path(root) / str(e['name'])} to have the entry "
                    "say it is not found"
                )
                break
    return out
