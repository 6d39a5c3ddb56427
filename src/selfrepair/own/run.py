"""One analysis of one ``own:`` entry, from the model's name to its files: the model
found offline and identity-checked, the data read (a malformed row costs that row), the
analysis run (:mod:`selfrepair.own.analyses`), its tables written, and one status row
saying what ran (model identity, dataset hash, the rows dropped) or why it did not.

Whatever cannot be analysed (a model or dataset that is not on this machine, a model
without per-head outputs, pairs longer than the model's context, a dataset without one
usable row) gives a "not run" row with the reason, and empty tables; the job succeeds.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from selfrepair.core.local_files import is_gguf_path
from selfrepair.own.entries import STATUS_COLUMNS, TABLES, dataset_sha256, task_kind

log = logging.getLogger(__name__)


def _pairs(bridge, folder, s: dict, bos: str = "tokenizer"):
    """(CounterfactualBatch, dropped rows, usable pairs, notes) of the entry's task for this
    model, a dataset's prompts with the BOS ``bos`` says (:data:`tasks.mib.BOS_MODES`);
    a dataset's rows are checked against the model's embedding size."""
    from selfrepair.core.models import check_context, folder_tokenizer
    from selfrepair.own.analyses import NotRun
    from selfrepair.own.data import load_pairs
    from selfrepair.tasks.registry import get_task

    task, n = s["task"], int(s["n_eval"])
    if task_kind(task) == "counterfactual":
        data, dropped, n_rows, notes = get_task(task).sample(n, seed=int(s["data_seed"])), [], n, []
        top = int(max(t.max() for t in (data.clean, data.corrupt, data.answer, data.foil)))
        if top >= bridge.cfg.d_vocab:
            raise NotRun(
                f"built-in task {task} uses token ids up to {top}; the model's vocabulary has {bridge.cfg.d_vocab}"
            )
    else:
        tokenizer = folder_tokenizer(str(folder), None)
        data, dropped, n_rows, notes = load_pairs(task, tokenizer, n, vocab_size=int(bridge.cfg.d_vocab), bos=bos)
        if len(tokenizer) > bridge.cfg.d_vocab:
            notes.append(f"the tokenizer has {len(tokenizer)} tokens, the model's embedding {bridge.cfg.d_vocab}")
    check_context(bridge, data.clean.shape[1], f"the pairs of {task}", s["model"])
    return data, dropped, n_rows, notes


def _dropped(dropped: list[str]) -> list[str]:
    """The status row's word on the dropped rows: how many, and the first with its reason."""
    return [f"{len(dropped)} rows dropped: {dropped[0]}"] if dropped else []


def _per_head(bridge) -> None:
    from selfrepair.own.analyses import NotRun

    missing = [
        f"blocks.{i}.attn.hook_z"
        for i in range(bridge.cfg.n_layers)
        if f"blocks.{i}.attn.hook_z" not in bridge.hook_dict
    ]
    if missing:
        raise NotRun(f"the model has no per-head outputs ({missing[0]} is not a hook of its bridge)")


def _model_type(folder) -> str:
    import json

    return str(json.loads((Path(folder) / "config.json").read_text()).get("model_type", ""))


def _gone(s: dict) -> str:
    """The row's word on a .gguf that is gone while its converted folder stands in for it."""
    from selfrepair.core.local_files import gguf_file

    if gguf_file(s["model"], s.get("search_paths")) is not None:
        return ""
    return f"{s['model']} is gone: analysed from the folder converted from it"


def compute(kind: str, s: dict, device: str, circuits_dir, row: dict) -> tuple[dict, str]:
    """(tables, what ran) of analysis ``kind`` of entry settings ``s``; the model's folder
    and identity go into ``row`` as soon as it is found."""
    from selfrepair.core import models as M
    from selfrepair.gim.graph import ungroups
    from selfrepair.own import analyses as A

    folder = M.resolve_local(s["model"], list(s.get("search_paths") or []))
    # a .gguf's converted folder is the workflow's (rule lm_convert made it): checked at
    # load as a packaged model's is; a folder the user brings is theirs as it is now
    brought = not is_gguf_path(s["model"])
    if not brought:
        M.check_unchanged(folder)
        M.check_provenance(folder, required=True)
    row.update(folder=str(folder), identity=M.model_identity(folder))
    log.info("model %s: folder %s, identity %s", s["model"], folder, row["identity"])
    record = [r for r in [M.brought_record(folder) if brought else _gone(s)] if r]  # said in the row
    for r in record:
        log.warning("%s", r)
    if kind == "g_vs_c":
        M.check_finite(folder)
        model = M.load_hf(folder, device, brought=brought)
        if type(model).__name__ != "GPT2LMHeadModel":
            raise A.NotRun(f"paper A's G and C run on a Hugging Face GPT-2; this model is a {type(model).__name__}")
        return A.g_vs_c(model.eval(), s), "; ".join(
            [f"{s['n_eval']} sequences of {s['task']} of length {s['length']}", *record]
        )
    # paper C's edges under MIB's conventions (gim.kv_inputs, gim.bos); the other analyses
    # score heads, which a key/value input per query head would not change
    edges = kind == "edges"
    bridge = M.load_bridge(folder, device, brought=brought, ungroup=edges and ungroups(s.get("kv_inputs", "per_group")))
    _per_head(bridge)
    data, dropped, n_rows, notes = _pairs(bridge, folder, s, s.get("bos", "tokenizer") if edges else "tokenizer")
    data = data.to(device)
    for d in dropped:
        log.warning("dropped %s", d)
    notes = [f"{len(data)} pairs used of {n_rows} usable", *_dropped(dropped), *notes, *record]
    if kind == "edges":
        tables, skipped = A.edges(bridge, data, s, circuits_dir)
        notes += skipped
    elif kind == "shapley":
        # a GPT-2's games run on paper A's ablation engine, as rules groundtruth_* run them
        hf = M.load_hf(folder, device, brought=brought) if _model_type(folder) == "gpt2" else None
        tables = A.shapley(bridge, data, s, hf_model=hf)
    elif kind == "coax":
        tables, seed, used = A.coax(bridge, data, s)
        if len(used) < len(data):
            notes.append(f"COAX on the {len(used)} pairs of {used.clean.shape[1]} tokens (it reads the last position)")
        notes.append(f"seed set {' '.join(seed)}" + ("" if s.get("seed_set") else " (by single ablation)"))
    else:
        raise ValueError(f"unknown analysis {kind!r}")
    return tables, "; ".join(notes)


def run_analysis(kind: str, s: dict, outputs: dict, device: str = "cpu") -> pd.DataFrame:
    """Run analysis ``kind`` of entry settings ``s`` and write ``outputs`` (table name ->
    path; ``circuits`` a folder; ``status`` the status row). Returns the status row."""
    from selfrepair.core import models as M
    from selfrepair.own.analyses import NotRun
    from selfrepair.own.data import NoPairs

    if kind not in TABLES:
        raise ValueError(f"unknown analysis {kind!r}; one of {', '.join(TABLES)}")
    circuits = outputs.get("circuits")
    if circuits:
        Path(circuits).mkdir(parents=True, exist_ok=True)
    row = {"name": s["name"], "analysis": kind, "model": s["model"], "task": s["task"], "folder": "", "identity": ""}
    row["dataset_sha256"] = dataset_sha256(s["task"])
    tables = {}
    try:
        tables, reason = compute(kind, s, device, circuits, row)
        row.update(status="ran", reason=reason)
    except M.WeightsChanged:
        raise
    except (
        M.ModelNotFound,
        M.CorruptCheckpoint,
        M.NonFiniteWeights,
        M.ContextTooShort,
        FileNotFoundError,
        NoPairs,
        NotRun,
    ) as err:
        row.update(status="not run", reason=str(err))
    except Exception as err:  # one analysis failing costs its row, not the run
        log.exception("analysis %s of %s failed; its status row says so", kind, s["name"])
        row.update(status="not run", reason=f"failed: {type(err).__name__}: {err}")
    for name in TABLES[kind]:
        tables.get(name, pd.DataFrame()).to_csv(outputs[name], index=False)
    status = pd.DataFrame([row], columns=STATUS_COLUMNS)
    status.to_csv(outputs["status"], index=False)
    log.info("%s", status.iloc[0].to_dict())
    return status
