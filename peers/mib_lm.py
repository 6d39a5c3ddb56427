"""MIB's own code beside ours on a real LM: the same IOI pairs, the same model bits, the
same batch, scored and evaluated by both; equal to what tolerance, and how fast.

The peers' code is MIB-circuit-track (commit b759df3) with EAP-IG (commit 7af394a, the
commit MIB pins as its submodule) and TransformerLens 2.15.4, in an environment of its
own; nothing of theirs is in this repository. To set it up in peers/work/ (ignored by
git; the default of ``--peers``), with CPU torch and MIB's pin of transformers:

    git clone https://github.com/hannamw/MIB-circuit-track peers/work/MIB-circuit-track
    git -C peers/work/MIB-circuit-track checkout b759df3
    git clone https://github.com/hannamw/EAP-IG peers/work/EAP-IG && git -C peers/work/EAP-IG checkout 7af394a
    python3 -m venv peers/work/mib-venv
    peers/work/mib-venv/bin/pip install torch==2.13.0   # the CPU build; never let pip pull a CUDA one
    peers/work/mib-venv/bin/pip install transformer-lens==2.15.4 transformers==4.46.3 \
        'datasets<4' 'matplotlib>=3.10.1' tabulate

Gemma-3 postdates MIB's pins (TransformerLens 2.15.4 and transformers 4.46.3 know no
Gemma-3); TransformerLens 2.18.0 has Gemma-3-270M among its models and needs
transformers 4.57 or later, so its side runs in a second environment, the same peers'
commits on PYTHONPATH:

    python3 -m venv peers/work/mib-venv-tl218
    peers/work/mib-venv-tl218/bin/pip install torch==2.13.0
    peers/work/mib-venv-tl218/bin/pip install transformer-lens==2.18.0 transformers==4.57.6 \
        'datasets<4' 'pyarrow<18' 'matplotlib>=3.10.1' tabulate

Then, with the project's environment:

    python peers/mib_lm.py --model results/lms/smollm2-135m/model \
        --data results/lms/data/ioi/test.jsonl --n 20 --rounds 1 --methods eap eap-ig ifr \
        --cross eap eap-ig --write
    python peers/mib_lm.py --model results/lms/gemma-3-270m/model --peer-venv mib-venv-tl218 \
        --official google/gemma-3-270m --data results/lms/data/ioi/test.jsonl --n 20 --rounds 1 \
        --methods eap eap-ig ifr --cross eap eap-ig --work results/benchmarks/peers_mib_gemma3 \
        --out results/benchmarks/peers_mib_gemma3.csv

(docs/results/peers.md says what each took; ``--analyse`` compares what an interrupted
run left in ``--work``).

MIB's side runs in a subprocess of the peer environment's python
(``peers/mib_side.py``, which says how it adapts TransformerLens 2.15.4 to the
folder); ours runs in this process (``localization``'s path: ``method_scores`` with
MIB's batch weighting, ``faithfulness_curves``), on our pairs with MIB's BOS
(``gim.bos: mib``), checked equal to the token ids MIB's code fed its model, and with our
graph's key and value inputs as ``--kv-inputs`` says (MIB's, one per query head, by
default: the model booted ungrouped; ``per_group``: one per key-value group, the run of
2026-12-06). Rounds alternate the two codes (ours, theirs, ours, theirs), every process
at ``--threads``.

Per method, one row of ``--out`` (results/benchmarks/peers_mib_smollm2.csv; ``--write``
copies it to results/reference/benchmark_peers_mib_smollm2.csv, whose block
``benchmark_peers_mib_smollm2`` docs/results/peers.md shows): the largest score
difference relative to the largest |score| (all edges; the edges other than key and
value inputs; key and value edges against the mean of MIB's per-head scores over the
head's key-value group), the Spearman correlation, the share of ours' top-n edges in
MIB's top-n at each of MIB's fractions (signed and absolute ranking), the largest
difference of the faithfulness curves, CPR and CMD of each code on its own scores and
of ours on MIB's circuit file (and, for the methods of ``--cross``, MIB's on ours), the seconds of
each side (fewest over the rounds) and their ratios, the machine, commits and N. More
columns take the remaining differences apart: for ``--cross``, MIB's curve on our file
against ours at the points whose circuit splits a key-value group between live heads and
at the others (``cross_curve_diff_split``, ``cross_curve_diff_whole``); for IFR (greedy
circuits), how far our own curves move when only the order of tied candidates changes
(``tie_curve_spread``, over our order and four of MIB's kind).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import peer_harness

COMMITS = {"MIB-circuit-track": "b759df3", "EAP-IG": "7af394a", "TransformerLens": "2.15.4"}
FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


# ---------------------------------------------------------------- comparison -----
def edge_vectors(ours: dict, theirs: dict):
    """(names, ours, theirs) of every edge, in MIB's file's order (two circuit files' dicts)."""
    import numpy as np

    names = list(theirs["edges"])
    if set(names) != set(ours["edges"]):
        raise ValueError("the two circuit files name different edges")
    a = np.array([ours["edges"][n]["score"] for n in names])
    b = np.array([theirs["edges"][n]["score"] for n in names])
    return names, a, b


def group_mean(names: list[str], b, n_heads: int, n_kv: int):
    """MIB's scores with each key/value edge replaced by the mean over its head's
    key-value group (the heads h with the same h // (n_heads / n_kv)) of the same parent."""
    import numpy as np

    rep = n_heads // n_kv
    where = {n: i for i, n in enumerate(names)}
    out = b.copy()
    for i, n in enumerate(names):
        parent, child = n.split("->")
        if child.endswith(("<k>", "<v>")):
            node, kind = child[:-3], child[-3:]
            layer, head = node[1:].split(".h")
            first = int(head) // rep * rep
            out[i] = np.mean([b[where[f"{parent}->a{layer}.h{h}{kind}"]] for h in range(first, first + rep)])
    return out


def top_share(a, b, n: int, absolute: bool) -> float:
    """Share of ``a``'s top-n edges that are among ``b``'s top-n (1.0 for n = 0)."""
    import numpy as np

    if n == 0:
        return 1.0
    ka, kb = (np.abs(a), np.abs(b)) if absolute else (a, b)
    ta, tb = np.argsort(-ka, kind="stable")[:n], np.argsort(-kb, kind="stable")[:n]
    return len(set(ta.tolist()) & set(tb.tolist())) / n


def compare(ours: dict, theirs: dict, n_heads: int, n_kv: int) -> dict:
    """Score agreement of two circuit files' dicts (ours, MIB's), over the edges MIB's
    file scores with a finite number; how many it does not is ``theirs_nonfinite_edges``."""
    import numpy as np
    from scipy.stats import spearmanr

    names, a, b = edge_vectors(ours, theirs)
    gm = group_mean(names, b, n_heads, n_kv)
    ok = np.isfinite(b)
    names, a, b, gm = [n for n, k in zip(names, ok) if k], a[ok], b[ok], gm[ok]
    scale = np.abs(b).max()
    kv = np.array([n.endswith(("<k>", "<v>")) for n in names])
    row = {
        "n_edges": len(ok),
        "theirs_nonfinite_edges": int((~ok).sum()),
        "max_abs_score": float(scale),
        "max_rel_diff": float(np.abs(a - b).max() / scale),
        "max_rel_diff_qmlp": float(np.abs(a - b)[~kv].max() / scale) if (~kv).any() else float("nan"),
        "max_rel_diff_kv_group": float(np.abs(a - gm)[kv].max() / scale) if kv.any() else float("nan"),
        "spearman": float(spearmanr(a, b).statistic),
    }
    for kind, absolute in (("signed", False), ("abs", True)):
        shares = [top_share(a, b, int(f * len(names)), absolute) for f in FRACTIONS]
        row.update({f"topn_{kind}_{f:g}": s for f, s in zip(FRACTIONS, shares)})
        row[f"topn_{kind}_min"] = min(shares)
    return row


def live_splits(graph, mask, n_heads: int, n_kv: int) -> list[str]:
    """The key and value edges that a circuit (``mask`` on ``graph``) leaves out of a live
    head while it keeps the same edge into another head of the head's key-value group: the
    places where MIB's evaluation (each query head's key or value input patched on its own)
    and ours (one input per group, clean if any head of the group keeps the edge) differ.
    A head counts as live when one of its output edges is in the circuit; a dead head's
    output is replaced by its corrupted output downstream, so its inputs change nothing."""
    rep = n_heads // n_kv
    kept = [(graph.forward[i], graph.backward[j]) for i, j in mask.nonzero().tolist()]
    live = {u for u, _ in kept}
    groups: dict[tuple, set[int]] = {}
    for u, v in kept:
        if v.endswith(("<k>", "<v>")):
            layer, head = v[1:-3].split(".h")
            groups.setdefault((u, layer, int(head) // rep, v[-3:]), set()).add(int(head))
    return [f"{u}->a{layer}.h{h}{kind}" for (u, layer, g, kind), heads in sorted(groups.items())
            for h in range(g * rep, (g + 1) * rep) if h not in heads and f"a{layer}.h{h}" in live]  # fmt: skip


def cross_split(graph, scores, method: str, ours: dict, theirs_eval: dict, n_heads: int, n_kv: int) -> dict:
    """MIB's evaluation of our circuit file against ours, point by point: the largest
    difference of the two faithfulness curves at the points whose circuit splits a
    key-value group between live heads (:func:`live_splits`), and at the other points,
    where both evaluations patch the same inputs and only float rounding (and the
    dangling edges MIB's pruning keeps) can part them."""
    from selfrepair.gim.graph import n_edges_at, select_edges, selection_rule

    split, whole, n_split = [0.0], [0.0], 0
    for key, absolute in (("signed", False), ("absolute", True)):
        for frac, x, y in zip(FRACTIONS, ours["faithfulness"][key], theirs_eval[key]["faithfulness"]):
            mask = select_edges(graph, scores, n_edges_at(frac, graph.n_edges), absolute, selection_rule(method))
            if live_splits(graph, mask, n_heads, n_kv):
                split.append(abs(x - y))
                n_split += 1
            else:
                whole.append(abs(x - y))
    return {"cross_curve_diff_split": max(split), "cross_curve_diff_whole": max(whole), "cross_split_points": n_split}


def tie_spread(bridge, graph, data, scores, batch: int, seeds=range(4)) -> dict:
    """How far the tie order moves our greedy circuits' faithfulness (IFR): the curves of
    our tie order and of ``mib_tie_order(graph, seed)`` for each seed (orders of the kind
    MIB's Python set draws), evaluated together; the largest range over the orders at one
    point, and the number of points (of 20) whose circuit depends on the order."""
    import torch

    from selfrepair.gim.evaluate import run_circuits
    from selfrepair.gim.graph import greedy_edges, mib_tie_order, n_edges_at

    orders = [None, *(mib_tie_order(graph, s) for s in seeds)]
    points = [(absolute, n_edges_at(f, graph.n_edges)) for absolute in (False, True) for f in FRACTIONS]
    masks = [[greedy_edges(graph, scores, n, absolute, tie_break=t) for t in orders] for absolute, n in points]
    flat = [graph.valid, torch.zeros_like(graph.valid), *(m for row in masks for m in row)]
    m = [r.mean().item() for r in run_circuits(bridge, graph, data, flat, batch)]
    full, empty, rest = m[0], m[1], m[2:]
    k = len(orders)
    faith = [[(x - empty) / (full - empty) for x in rest[p * k : (p + 1) * k]] for p in range(len(points))]
    differ = sum(any(not bool((row[0] == other).all()) for other in row[1:]) for row in masks)
    return {"tie_curve_spread": max(max(f) - min(f) for f in faith), "tie_orders": k, "tie_points_differ": differ}


# ---------------------------------------------------------------- our side -------
def our_side(bridge, graph, data, method: str, batch: int, ig_steps: int, out: Path) -> dict:
    """Our scores and both curves of one method, timed; our circuit file written."""
    import torch  # noqa: F401  (loaded already)

    from selfrepair.gim.attribute import method_scores
    from selfrepair.gim.evaluate import cmd, cpr, faithfulness_curves
    from selfrepair.gim.graph import save_mib_json, selection_rule

    w, c = time.perf_counter(), time.process_time()
    scores = method_scores(bridge, graph, data, method, batch, ig_steps, "mib")
    s_wall, s_cpu = time.perf_counter() - w, time.process_time() - c
    w, c = time.perf_counter(), time.process_time()
    curves = faithfulness_curves(bridge, graph, data, scores, FRACTIONS, (False, True), batch,
                                 selection=selection_rule(method))  # fmt: skip
    e_wall, e_cpu = time.perf_counter() - w, time.process_time() - c
    save_mib_json(out / f"ours_{method}.json", graph, scores)
    f = {
        k: [p["faithfulness"] for p in curves[absolute]["points"]]
        for k, absolute in (("signed", False), ("absolute", True))
    }
    kept = {
        k: [p["n_kept"] for p in curves[absolute]["points"]] for k, absolute in (("signed", False), ("absolute", True))
    }
    return {"faithfulness": f, "n_kept": kept, "cpr": cpr(FRACTIONS, f["signed"]), "cmd": cmd(FRACTIONS, f["absolute"]),
            "score_wall_s": s_wall, "score_cpu_s": s_cpu, "eval_wall_s": e_wall, "eval_cpu_s": e_cpu}  # fmt: skip


def our_eval_of(bridge, path: Path, method: str, data, batch: int) -> tuple[float, float]:
    """(CPR, CMD) of our evaluation of a circuit file's scores (MIB's file read by ours);
    NaN where the file scores an edge with a number that is not finite (the ranking it
    would give is undefined: our reader refuses it)."""
    import math

    from selfrepair.gim.evaluate import cmd, cpr, faithfulness_curves
    from selfrepair.gim.graph import from_mib_json, selection_rule

    edges = json.loads(path.read_text())["edges"].values()
    if not all(isinstance(e["score"], (int, float)) and math.isfinite(e["score"]) for e in edges):
        return math.nan, math.nan
    graph, scores, _ = from_mib_json(path, n_kv_heads=bridge.cfg.n_key_value_heads)
    curves = faithfulness_curves(bridge, graph, data, scores, FRACTIONS, (False, True), batch,
                                 selection=selection_rule(method))  # fmt: skip
    f = {a: [p["faithfulness"] for p in curves[a]["points"]] for a in (False, True)}
    return cpr(FRACTIONS, f[False]), cmd(FRACTIONS, f[True])


def check_tokens(data, check: dict) -> None:
    """MIB's token ids and labels are ours (after its BOS): ValueError otherwise."""
    for i in range(len(data)):
        n = int(data.pos[i]) + 1
        for ours, theirs in (
            (data.clean[i, :n].tolist(), check["clean"][i]),
            (data.corrupt[i, :n].tolist(), check["corrupt"][i]),
        ):
            if ours != theirs:
                raise ValueError(f"pair {i}: MIB fed {theirs}, ours {ours}")
        if [int(data.answer[i]), int(data.foil[i])] != check["labels"][i]:
            raise ValueError(f"pair {i}: MIB's labels {check['labels'][i]}")


def recover(work: Path, runs: dict, loads: list, check, meta: dict) -> tuple:
    """What a run stopped inside MIB's side left: each method whose MIB run file
    (``round0/<method>_run.json``) was written but is not yet in runs.json joins
    ``runs["theirs"]``, and MIB's check.json its check. MIB's side writes a method's file
    once its scores and curves are done, so the methods taken are whole; the load at MIB's
    start was not recorded, so only ours' loads count."""
    first = work / "round0"
    if check is None and (first / "check.json").exists():
        check = json.loads((first / "check.json").read_text())
    for m in runs["ours"]:
        f = first / f"{m}_run.json"
        if not runs["theirs"].get(m) and f.exists():
            runs["theirs"][m] = [json.loads(f.read_text())]
            meta = {**meta, "recovered": sorted({*meta.get("recovered", []), m})}
    return runs, loads, check, meta


def peer_versions(check: dict) -> dict:
    """The peers' commits and the TransformerLens (and transformers) MIB's side ran on:
    what its check.json records, else the versions of the first runs (:data:`COMMITS`)."""
    out = {c.lower().replace("-", "_"): v for c, v in COMMITS.items()}
    got = check.get("versions") or {}
    out["transformerlens"] = got.get("transformer_lens", out["transformerlens"])
    out["transformers"] = got.get("transformers", "4.46.3")
    return out


# ---------------------------------------------------------------- the run --------
def peer_run(a, out: Path, extra: list[str]) -> float:
    """One run of MIB's side (``mib_side.py``) in the peer environment; its load average
    at the start."""
    env = peer_harness.peer_env(a.threads, PYTHONPATH=os.pathsep.join(peer_paths(a)[1:]))
    cmd = [peer_paths(a)[0], str(Path(__file__).resolve().parent / "mib_side.py"),
           "--model", a.model, "--data", a.data, "--n", str(a.n), "--batch-size", str(a.batch_size),
           "--ig-steps", str(a.ig_steps), "--threads", str(a.threads), "--out", str(out), *extra,
           *(["--official", a.official] if a.official else [])]  # fmt: skip
    load = os.getloadavg()[0]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"MIB's side failed:\n{r.stderr[-4000:]}")
    return load


def peer_paths(a) -> list[str]:
    """The peer environment's python, then its PYTHONPATH: EAP-IG's src/ and MIB's checkout."""
    return [str(Path(a.peers) / p) for p in (f"{a.peer_venv}/bin/python", "EAP-IG/src", "MIB-circuit-track")]


def measure(a, bridge, graph, fed, work: Path):
    """Rounds of ours then MIB's, MIB's evaluation of our files (``--cross``) after the
    first: ({"ours"|"theirs": {method: [run, ...]}}, load averages at each side's start,
    MIB's check.json). What has run so far is in ``work``/runs.json after each step, so
    ``--analyse`` can compare the rounds that finished."""
    runs, loads, check = {"ours": {}, "theirs": {}}, [], None

    meta = run_meta()

    def save():
        (work / "runs.json").write_text(json.dumps({"runs": runs, "loads": loads, "check": check, "meta": meta}))

    for r in range(a.rounds):
        methods = [m for m in a.methods if r == 0 or m not in a.once]
        out = work / f"round{r}"
        out.mkdir(parents=True, exist_ok=True)
        loads.append(os.getloadavg()[0])
        for m in methods:
            runs["ours"].setdefault(m, []).append(our_side(bridge, graph, fed, m, a.batch_size, a.ig_steps, out))
        print(f"round {r}: ours done", flush=True)
        save()
        loads.append(peer_run(a, out, ["--methods", *methods]))
        check = json.loads((out / "check.json").read_text())
        for m in methods:
            runs["theirs"].setdefault(m, []).append(json.loads((out / f"{m}_run.json").read_text()))
        print(f"round {r}: MIB's done", flush=True)
        save()
        if r == 0 and a.cross:
            peer_run(a, work / "cross", ["--evaluate", *[str(out / f"ours_{m}.json") for m in a.cross]])
            print("MIB's evaluation of our files done", flush=True)
    return runs, loads, check, meta


def run_meta() -> dict:
    """The machine, commit and date of a run (kept in runs.json, so that ``--analyse``
    credits the run, not the analysis)."""
    return {"machine": peer_harness.machine(), "commit": peer_harness.commit(), "date": time.strftime("%Y-%m-%d")}


def method_row(m: str, a, runs: dict, bridge, fed, work: Path, n_kv: int) -> dict:
    """One method's row: agreement of the last round both sides ran, CPR and CMD each way,
    where MIB's evaluation of our file parts from ours (:func:`cross_split`), how far the
    tie order moves a greedy method's curves (:func:`tie_spread`), seconds
    (:func:`time_columns`)."""
    from selfrepair.gim.graph import from_mib_json, selection_rule

    k = len(runs["theirs"][m])  # rounds that ran on both sides
    last = work / f"round{k - 1}"
    ours_file = json.loads((last / f"ours_{m}.json").read_text())
    theirs_file = json.loads((last / f"{m}.json").read_text())
    o, t = runs["ours"][m][k - 1], runs["theirs"][m][k - 1]
    row = {"method": m, **compare(ours_file, theirs_file, bridge.cfg.n_heads, n_kv)}
    row["curve_max_diff"] = max(abs(x - y) for r in ("signed", "absolute")
                                for x, y in zip(o["faithfulness"][r], t[r]["faithfulness"]))  # fmt: skip
    row["n_kept_max_diff"] = max(abs(x - y) for r in ("signed", "absolute")
                                 for x, y in zip(o["n_kept"][r], t[r]["weighted_edge_counts"]))  # fmt: skip
    row.update(cpr_ours=o["cpr"], cpr_theirs=t["cpr"], cmd_ours=o["cmd"], cmd_theirs=t["cmd"])
    row["cpr_ours_on_theirs"], row["cmd_ours_on_theirs"] = our_eval_of(bridge, last / f"{m}.json", m, fed, a.batch_size)
    n_heads = bridge.cfg.n_heads
    if (work / "cross" / f"ours_{m}_eval.json").exists():  # MIB's evaluation of our round-0 file
        x = json.loads((work / "cross" / f"ours_{m}_eval.json").read_text())
        row["cpr_theirs_on_ours"], row["cmd_theirs_on_ours"] = x["cpr"], x["cmd"]
        graph, scores, _ = from_mib_json(work / "round0" / f"ours_{m}.json", n_kv_heads=n_kv)
        row.update(cross_split(graph, scores, m, runs["ours"][m][0], x, n_heads, n_kv))
    if selection_rule(m) == "greedy":
        graph, scores, _ = from_mib_json(last / f"ours_{m}.json", n_kv_heads=n_kv)
        row.update(tie_spread(bridge, graph, fed, scores, a.batch_size))
    return {**row, **time_columns(runs, m, k, row["n_edges"]), "rounds": k}


def time_columns(runs: dict, m: str, k: int, n_edges: int) -> dict:
    """Each side's fewest seconds over its first ``k`` rounds, the ratios ours / MIB's and
    EActP's projected hours."""
    row = {}
    for side, key in (("ours", "ours"), ("theirs", "mib")):
        for what in ("score_wall_s", "score_cpu_s", "eval_wall_s", "eval_cpu_s"):
            row[f"{key}_{what}"] = min(run[what] for run in runs[side][m][:k])
    for unit in ("wall", "cpu"):
        ours_s = row[f"ours_score_{unit}_s"] + row[f"ours_eval_{unit}_s"]
        mib_s = row[f"mib_score_{unit}_s"] + row[f"mib_eval_{unit}_s"]
        row[f"{unit}_ratio"] = ours_s / mib_s
        row[f"score_{unit}_ratio"] = row[f"ours_score_{unit}_s"] / row[f"mib_score_{unit}_s"]
        row[f"eval_{unit}_ratio"] = row[f"ours_eval_{unit}_s"] / row[f"mib_eval_{unit}_s"]
    # EActP, projected from the evaluation's seconds per forward of the N pairs: MIB's
    # evaluate_area_under_curve runs 23 per ranking (the clean baseline, the empty
    # circuit's corrupted and patched runs, two per fraction) and get_scores_exact 2 per
    # edge; ours at most 23 for both rankings (one corrupted, one per distinct circuit)
    # and one per edge (the patched runs of all parents of an input share a batched
    # forward): 23 taken, so ours is not flattered
    row["eactp_projected_h_mib"] = n_edges * 2 * row["mib_eval_wall_s"] / 46 / 3600
    row["eactp_projected_h_ours"] = n_edges * row["ours_eval_wall_s"] / 23 / 3600
    return row


def parser():
    """The command line: the peers' harness's options and this comparison's."""
    ap = peer_harness.arguments(__doc__, "peers_mib_smollm2.csv")
    ap.add_argument(
        "--peers", default=str(peer_harness.CHECKOUTS), help="MIB-circuit-track/, EAP-IG/ and mib-venv/ (peers/work)"
    )
    ap.add_argument("--model", required=True, help="the model folder (float32 safetensors and tokenizer.json)")
    ap.add_argument("--data", required=True, help="MIB-format IOI JSONL (the test split)")
    ap.add_argument("--n", type=int, default=20, help="the first N pairs (default 20)")
    ap.add_argument("--batch-size", type=int, default=20, help="MIB's default 20 (N if smaller)")
    ap.add_argument("--ig-steps", type=int, default=5)
    ap.add_argument("--methods", nargs="+", default=["eap", "eap-ig", "ifr"])
    ap.add_argument("--rounds", type=int, default=2, help="ours then MIB's, this many times")
    ap.add_argument(
        "--once", nargs="*", default=[], help="methods run in the first round only (MIB's greedy IFR circuits are slow)"
    )
    ap.add_argument(
        "--cross", nargs="*", default=[], help="methods whose circuit files of ours MIB's code evaluates too"
    )
    ap.add_argument("--peer-venv", default="mib-venv", help="the peer environment under --peers (mib-venv)")
    ap.add_argument(
        "--official",
        default=None,
        help="MIB's side loads the folder as this TransformerLens name (google/gemma-3-270m)",
    )
    ap.add_argument(
        "--kv-inputs", default="per_query_head", choices=["per_query_head", "per_group"],
        help="our graph's key and value inputs (gim.kv_inputs; MIB's: per_query_head)",
    )  # fmt: skip
    ap.add_argument("--analyse", action="store_true", help="compare the runs already in --work (runs.json)")
    ap.add_argument("--work", default=str(peer_harness.BENCHMARKS / "peers_mib"), help="the runs' files")
    return ap


def main(argv=None):
    peer_harness.configure(None if argv is None else ["mib_lm.py", *argv])
    a = parser().parse_args(argv)
    peer_harness.start(a)
    if not a.analyse:
        peer_harness.need(*peer_paths(a))

    import pandas as pd
    import torch

    from selfrepair.core.models import folder_tokenizer, load_bridge
    from selfrepair.gim.graph import Graph, ungroups
    from selfrepair.tasks import mib

    a.batch_size = min(a.batch_size, a.n)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    bridge = load_bridge(a.model, ungroup=ungroups(a.kv_inputs))
    tok = folder_tokenizer(a.model)
    # MIB's BOS (gim.bos: mib), as its tokenize_plus feeds the pairs; checked below
    fed = mib.load("ioi", tok, a.n, [str(Path(a.data).parent.parent)], split=Path(a.data).stem, bos="mib")
    graph = Graph.from_bridge(bridge)
    saved = work / "runs.json"
    if a.analyse:
        kept = json.loads(saved.read_text())
        if "meta" not in kept:
            raise SystemExit(f"{saved} has no 'meta' (the run's machine, commit and date): add them by hand")
        runs, loads, check, meta = recover(work, *(kept[k] for k in ("runs", "loads", "check", "meta")))
    else:
        runs, loads, check, meta = measure(a, bridge, graph, fed, work)
    check_tokens(fed, check)
    logits_rel = check["logits_max_abs_diff"] / check["logits_max_abs"]
    with torch.no_grad():
        ours_logits = bridge(fed.clean)[torch.arange(len(fed)), fed.pos]
    ours_logits = ours_logits - ours_logits.mean(-1, keepdim=True)
    theirs_logits = torch.tensor(check["read_logits_centred"])
    read_rel = float((ours_logits - theirs_logits).abs().max() / theirs_logits.abs().max())

    n_kv = bridge.cfg.n_key_value_heads or bridge.cfg.n_heads
    common = dict(kv_inputs=a.kv_inputs, logits_rel_diff_tl_hf=logits_rel, read_logits_rel_diff_ours_tl=read_rel, n=len(fed),
                  batch_size=a.batch_size, ig_steps=a.ig_steps, threads=a.threads, load_min=min(loads),
                  load_max=max(loads), machine=meta["machine"], model=Path(a.model).resolve().parent.name,
                  data=Path(a.data).name, **peer_versions(check),
                  commit=meta["commit"], date=meta["date"], analysis_commit=peer_harness.commit())  # fmt: skip
    methods = [m for m in a.methods if runs["theirs"].get(m)]  # the methods that ran on both sides
    rows = [{**method_row(m, a, runs, bridge, fed, work, n_kv), **common} for m in methods]
    table = pd.DataFrame(rows)
    peer_harness.write(table, a)
    print(table[["method", "max_rel_diff", "spearman", "cpr_ours", "cpr_theirs", "wall_ratio"]].to_string())


if __name__ == "__main__":
    main()
    sys.exit(0)
