"""The records of what each workflow job wrote, and the checks of what a job reads.

A job that ends without an error records each of its outputs (:func:`write_records`):
the rule, wildcards and parameters' SHA-256 that wrote it, and its content's SHA-256 (a
folder of tables: each file's too). Before a job reads a table another rule wrote,
:func:`check_inputs` compares it with its record and stops (``TableChanged``, naming the
file, the tables changed in a folder, and the way out) on one that is not as its rule
wrote it. :mod:`selfrepair.core.runtime` calls both around every job.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from selfrepair.core.files import sha256_file, write_json

# Where a job records what it wrote: one JSON per output, named by the output's path,
# under the working directory (the results tree holds the outputs only).
RECORDS = Path(".selfrepair") / "records"


class TableChanged(RuntimeError):
    """An input of a rule is not what the rule that wrote it wrote."""


def content_sha256(path) -> str:
    """A file's SHA-256; a folder's: the SHA-256 of its files' relative paths and digests
    (less the ``.snakemake_timestamp`` Snakemake puts in a ``directory()`` output after its job)."""
    import hashlib

    path = Path(path)
    if not path.is_dir():
        return sha256_file(path)
    h = hashlib.sha256()
    for rel, digest in folder_files(path).items():
        h.update(f"{rel}\0{digest}\n".encode())
    return h.hexdigest()


def folder_files(path) -> dict[str, str]:
    """{relative path: SHA-256} of a folder's files, by path (less Snakemake's
    ``.snakemake_timestamp``): what a folder output's record holds, so that a check names
    the table in it that changed."""
    path = Path(path)
    files = sorted(q for q in path.rglob("*") if q.is_file() and q.name != ".snakemake_timestamp")
    return {f.relative_to(path).as_posix(): sha256_file(f) for f in files}


def folder_changes(recorded: dict, now: dict) -> list[str]:
    """What differs between a folder's recorded files and its files now, one phrase each
    (edited, gone, added), by relative path."""
    out = [f"{n} edited" for n in sorted(set(recorded) & set(now)) if recorded[n] != now[n]]
    out += [f"{n} gone" for n in sorted(set(recorded) - set(now))]
    return out + [f"{n} added" for n in sorted(set(now) - set(recorded))]


def is_model_folder(path) -> bool:
    """A model folder (its ``selfrepair.json`` beside the weights): each load checks its files."""
    return Path(path).is_dir() and (Path(path) / "selfrepair.json").is_file()


def record_path(output) -> Path | None:
    """Where the record of ``output`` lives (None: an output outside the working directory)."""
    rel = os.path.normpath(os.path.relpath(os.path.abspath(str(output))))
    if rel.startswith(".."):
        return None
    return RECORDS / (rel + ".json")


def write_records(job: dict | None) -> None:
    """The record of each output of ``job`` that exists (see :func:`track`)."""
    for out in (job or {}).get("outputs", []):
        rec = record_path(out)
        if rec is None or not Path(out).exists():
            continue
        entry = {k: job[k] for k in ("rule", "wildcards", "params_sha256")}
        if Path(out).is_dir() and not is_model_folder(out):  # a folder of tables: each by name
            entry["files"] = folder_files(out)
        write_json(rec, {"file": out, **entry, "sha256": content_sha256(out)})


def check_inputs(smk, under: str = "results", strict: bool = True) -> list[str]:
    """Refuse (TableChanged, naming the file and the fix) an input under ``under`` whose
    content differs from what its rule wrote (its record), or that has no record (not
    written by a rule of this workflow in this folder). Returns one line per checked input,
    for the job's log. What the published claims and the figures call before reading.
    Not ``strict`` (what every job checks first, :func:`track`): files and folders of
    tables with a record only; model folders (each load checks its ``selfrepair.json``)
    and files without one (committed checkpoints' logs seeded into a results tree) are
    left to the job. A changed folder is reported by the tables in it that changed."""
    lines = []
    for inp in map(str, smk.input):
        rel = os.path.normpath(os.path.relpath(os.path.abspath(inp)))
        if rel.split(os.sep)[0] != under or not Path(inp).exists():
            continue
        rec = record_path(inp)
        if not strict and (rec is None or not rec.is_file() or is_model_folder(inp)):
            continue
        if rec is None or not rec.is_file():
            raise TableChanged(
                f"{inp} has no record of the rule that wrote it ({rec}): it was not written by this "
                "workflow's rule in this folder (put there by hand or copied?), so the verdicts and figures "
                f"made from it cannot be trusted. Delete {inp} and rerun snakemake: its rule writes it again"
            )
        want = _read_record(rec, inp)
        now = content_sha256(inp)
        if now != want.get("sha256"):
            rule = want.get("rule", "?")
            what = f"{inp} changed since rule {rule} wrote it"
            if Path(inp).is_dir() and isinstance(want.get("files"), dict):
                what += f" ({'; '.join(folder_changes(want['files'], folder_files(inp)))})"
            raise TableChanged(
                f"{what} (sha256 {want.get('sha256')} recorded in {rec}, "
                f"{now} now): a table that another rule reads must be what its rule wrote. "
                f"Undo the edit, or rerun its rule: snakemake --forcerun {rule} (the rules that read it rerun too)"
            )
        lines.append(f"checked {inp}: sha256 {now[:16]} as rule {want.get('rule')} wrote it")
    for line in lines:
        print(line, file=sys.stderr, flush=True)
    return lines


def _read_record(rec: Path, inp: str) -> dict:
    """The record ``rec`` of input ``inp``; TableChanged, naming both and the way out, when
    it is not a JSON object (cut short by a full disk, edited by hand)."""
    fix = f"Delete {inp} and rerun snakemake: its rule writes it and its record again"
    try:
        want = json.loads(rec.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TableChanged(f"{rec}, the record of {inp}, is not valid JSON ({err}), so nothing shows "
                           f"{inp} is what its rule wrote. {fix}") from None  # fmt: skip
    if not isinstance(want, dict) or not isinstance(want.get("sha256"), str):
        raise TableChanged(f"{rec}, the record of {inp}, holds no sha256 of its content (a JSON "
                           f"{type(want).__name__} without one), so nothing shows {inp} is what its rule wrote. {fix}")  # fmt: skip
    return want
