"""Paper B's COAX and its baselines, ours beside the COAX authors' release 2.1.0, on one
real LM (default: SmolLM2-135M-Instruct, the workflow's converted folder): the same
prompts, the same primaries (seed set), the same model bits, the same thread count.

    python peers/coax_lm.py [--peer-repo PEER] [--peer-python PEER_PY] [--model FOLDER]
        [--n-prompts 2] [--data-seed 1] [--repeats 2] [--threads 1] [--write]

The peer: repository GongZhiren/Conditional-Co-Ablation at commit
33f1f0231debd8800141be32918e05f3d2f11598 (release 2.1.0), in an environment of its own,
its dependencies as its ``requirements-tested.txt`` pins them, with this machine's torch;
set up in peers/work/ (ignored by git), where ``--peer-repo`` and ``--peer-python`` look
by default::

    git clone https://github.com/GongZhiren/Conditional-Co-Ablation peers/work/Conditional-Co-Ablation
    git -C peers/work/Conditional-Co-Ablation checkout 33f1f0231debd8800141be32918e05f3d2f11598
    python3 -m venv peers/work/coax-venv && peers/work/coax-venv/bin/pip install torch==2.13.0
    peers/work/coax-venv/bin/pip install torch==2.13.0 transformers==4.57.1 accelerate==1.11.0 \\
        huggingface-hub==0.36.2 numpy==2.3.3 scipy==1.16.3 scikit-learn==1.7.2 PyYAML==6.0.3

Nothing of the peer's is imported here: this file runs itself under the peer's
interpreter with ``--peer-side`` (the release's own functions called on its own
prompts) and reads back what it wrote.

Ours chooses, as rule coax_lm does (:mod:`selfrepair.coax.lms`, config ``coax.lms``
defaults): BOS or not (``bos_table``), the primaries (name movers) and the backups by
conditional ablation (``ioi_heads``) on the truth prompts; the release is given those
primaries and scores every head; both are compared on the candidates (every head but
the primaries) against those backups. Per score: the largest difference relative to
the largest |score| (the release's), Spearman's rank correlation, the overlap of the two
top-``--top-k`` sets, the ROC-AUC of each (ours with ``core.stats.roc_auc``, the
release's with scikit-learn's, as its script), and each code's wall and CPU seconds,
the fewest of ``--repeats`` interleaved rounds (ours, theirs, ours, ...), with the
1-minute load average. Methods: ``coax`` (one call: single, cond, comp and the
amplification ratio), ``atp_mag`` (the release's AtP), ``cond_grad``, ``eap_ig``,
``atp_star``, ``atp_star_s`` (AtP* with the primaries ablated; with ``atp_star`` it
gives ``atp_star_2s``), ``atp_2s`` = cond_grad - atp_mag.

The adapter (:func:`adapted_folder`): transformers 4.57 (the release's pin) reads the
folder's config and tokenizer files written by transformers 5 wrongly or not at all, so
the peer gets a folder of links to the same weights and tokenizer.json, with two fields
changed: config.json gains ``rope_theta`` (transformers 5 keeps it in
``rope_parameters``; 4.57 would use its default 10,000 instead of SmolLM2's 100,000) and
tokenizer_config.json's ``tokenizer_class`` ``TokenizersBackend`` (a transformers 5
class) becomes ``PreTrainedTokenizerFast``. The release's loader is given
``torch_dtype: float32`` (the folder's) and ``device_map: cpu``. The clean logits of
both codes are compared first (``logits`` row) and the token ids of the release's
prompts against ours (``--check-seeds``, ``--check-prompts``), both prompt paths of
ours: ``tasks.ioi.gpt2_prompts`` with the checkpoint tokenizer and ``coax.lms.lm_prompts``.
Writes results/benchmarks/peers_coax_lm.csv (--out; --write: also
results/reference/benchmark_peers_coax_lm.csv and its block in docs/results/peers-coax.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PEER_COMMIT = "33f1f0231debd8800141be32918e05f3d2f11598"
SCORES = ("single", "cond", "comp", "amp_ratio", "atp_mag", "cond_grad", "atp_2s", "eap_ig", "atp_star", "atp_star_2s")


# ----------------------------------------------------------------------------------
# The peer's side: runs under the peer's interpreter, imports the release only
# ----------------------------------------------------------------------------------
def _clock(times: dict, name: str, fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    times[name] = {"wall": time.perf_counter() - w, "cpu": time.process_time() - c, "load": os.getloadavg()[0]}
    return out


def peer_side(spec_file: str) -> None:
    """The release's scores of every head on its own prompts (``spec``: model folder,
    threads, prompts, seed, primaries, the candidates' labels), into ``spec['out']``."""
    import numpy as np
    import torch

    spec = json.loads(Path(spec_file).read_text())
    sys.path.insert(0, str(Path(spec["repo"]) / "src"))
    torch.set_num_threads(int(spec["threads"]))
    from curvgraph import baselines as B
    from curvgraph import circuits as C
    from curvgraph._core.model import load_model_bundle
    from curvgraph.coablation import CoAblation
    from sklearn.metrics import roc_auc_score

    cfg = {"path": spec["model"], "torch_dtype": "float32", "device_map": "cpu", "local_files_only": True}
    bundle = load_model_bundle(cfg, {})
    n_u = bundle.num_layers * bundle.num_heads
    prim = [tuple(p) for p in spec["primaries"]]
    out, times = {"tokens": {}}, {}
    for seed in spec["check_seeds"]:
        ps = C.ioi_prompts(int(spec["check_prompts"]), seed=int(seed))
        tok = bundle.tokenizer
        out["tokens"][str(seed)] = [
            [tok(e["prompt"])["input_ids"], tok(e["io"], add_special_tokens=False)["input_ids"][0],
             tok(e["s"], add_special_tokens=False)["input_ids"][0]] for e in ps
        ]  # fmt: skip
    prompts = C.ioi_prompts(int(spec["n_prompts"]), seed=int(spec["data_seed"]))
    seqs = [bundle.tokenizer(e["prompt"], return_tensors="pt")["input_ids"] for e in prompts]
    seqs = [s for s in seqs if s.shape[1] >= 4]
    out["data_tokens"] = [q[0].tolist() for q in seqs]
    out["last_logits"] = torch.cat([C._forward_logits(bundle, s)[:, -1] for s in seqs]).tolist()
    top_r = int(bundle.tokenizer.vocab_size)
    r = _clock(times, "coax", lambda: CoAblation(bundle, seqs, top_r=top_r, position_mode="last")
               .conditional_compensation(prim, head_set=list(range(n_u))))  # fmt: skip
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(r["single"] > 0, r["conditional"] / np.maximum(r["single"], 1e-30), np.nan)
    # as backup_recovery_full.py stores them: NaN (a ratio where single is 0) as 0
    s = {
        k: np.nan_to_num(v)
        for k, v in zip(("single", "cond", "comp"), (r["single"], r["conditional"], r["compensation"]))
    }
    s["amp_ratio"] = np.nan_to_num(ratio)
    s["atp_mag"] = _clock(times, "atp_mag", lambda: B.head_attribution_patching(bundle, prompts))
    s["cond_grad"] = _clock(times, "cond_grad", lambda: B.conditional_attribution_patching(bundle, prompts, prim))
    s["eap_ig"] = _clock(times, "eap_ig", lambda: B.integrated_gradient_attribution(bundle, prompts))
    s["atp_star"] = _clock(times, "atp_star", lambda: B.head_attribution_graddrop(bundle, prompts))
    star_s = _clock(times, "atp_star_s", lambda: B.head_attribution_graddrop(bundle, prompts, ablate_heads=prim))
    s["atp_2s"] = s["cond_grad"] - s["atp_mag"]
    s["atp_star_2s"] = star_s - s["atp_star"]
    cand, y = spec["candidates"], spec["labels"]
    out["scores"] = {k: [float(v[u]) for u in cand] for k, v in s.items()}
    out["auc"] = {
        k: float(roc_auc_score(y, np.nan_to_num(np.asarray(v, float), nan=0.0))) for k, v in out["scores"].items()
    }
    out["times"] = times
    Path(spec["out"]).write_text(json.dumps(out))


if __name__ == "__main__" and "--peer-side" in sys.argv:
    peer_side(sys.argv[sys.argv.index("--peer-side") + 1])
    raise SystemExit(0)

# ----------------------------------------------------------------------------------
# Ours, and the comparison
# ----------------------------------------------------------------------------------
import peer_harness  # noqa: E402

NUMERICS = peer_harness.configure()  # before torch is imported

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from scipy import stats  # noqa: E402

from selfrepair.coax import baselines, lm_seeds, lms  # noqa: E402
from selfrepair.coax import score as coax  # noqa: E402
from selfrepair.core.interventions import Prefix  # noqa: E402
from selfrepair.core.models import checkpoint_tokenizer, load_bridge  # noqa: E402
from selfrepair.core.stats import roc_auc  # noqa: E402
from selfrepair.tasks import ioi  # noqa: E402

MODEL = peer_harness.ROOT / "results" / "lms" / "smollm2-135m" / "model"
PEER_REPO = peer_harness.CHECKOUTS / "Conditional-Co-Ablation"  # the defaults: peers/README.md
PEER_PYTHON = peer_harness.CHECKOUTS / "coax-venv" / "bin" / "python"


def adapted_folder(model: Path, dest: Path) -> Path:
    """``dest``: links to ``model``'s files, with config.json's ``rope_theta`` put at the
    top level (from ``rope_parameters``) and tokenizer_config.json's transformers-5
    ``TokenizersBackend`` class named ``PreTrainedTokenizerFast`` (module docstring)."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in model.iterdir():
        if f.name not in ("config.json", "tokenizer_config.json"):
            (dest / f.name).unlink(missing_ok=True)
            (dest / f.name).symlink_to(f.resolve())
    cfg = json.loads((model / "config.json").read_text())
    rope = cfg.get("rope_parameters") or {}
    if "rope_theta" not in cfg and "rope_theta" in rope:
        cfg["rope_theta"] = rope["rope_theta"]
    (dest / "config.json").write_text(json.dumps(cfg, indent=2))
    tc = json.loads((model / "tokenizer_config.json").read_text())
    if tc.get("tokenizer_class") == "TokenizersBackend":
        tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    (dest / "tokenizer_config.json").write_text(json.dumps(tc, indent=2))
    return dest


def setup(args):
    """(bridge, tokenizer, BOS, the data prompts, primaries, backups, candidates), as
    rule coax_lm chooses them with its name-mover seeding, on the release's own template
    (ABBA, the only one its code draws; the rule alternates ABBA and BABA)."""
    bridge = load_bridge(args.model)
    tok = checkpoint_tokenizer(args.model)
    t = lms.bos_table(bridge, tok, args.n_bos, args.truth_seed)
    bos = bool(t.loc[t["chosen"], "bos"].iloc[0])
    templates = ["ABBA"]
    truth = lms.lm_prompts(tok, args.n_truth, args.truth_seed, bos, bridge, templates)
    seeds, _ = lms.truth_seeds(bridge, truth, lm_seeds.template_names(len(truth), templates), args.n_primary,
                               args.backup_share, args.max_rows, ["name_movers"])  # fmt: skip
    prim, cands, back = seeds["name_movers"]
    prompts = lms.lm_prompts(tok, args.n_prompts, args.data_seed, bos, bridge, templates)
    return bridge, tok, bos, prompts, prim, back, cands


def ours(bridge, prompts, prim, cands, args) -> tuple[dict, dict]:
    """({score: {unit: value}}, {method: seconds}) of our code, each method on its own."""
    metric = lambda lg: ioi.logit_diff(lg, prompts)  # noqa: E731
    tokens, last, times = prompts.tokens, [prompts.tokens.shape[1] - 1], {}

    def scan():
        pfx = Prefix(bridge, tokens, keep_z=True, positions=last)
        return coax.scan(bridge, tokens, cands, prim, "v2", 192, max_rows=args.max_rows, prefix=pfx,
                         vocab=coax.release_vocab(bridge)).table  # fmt: skip

    table = _clock(times, "coax", scan)
    s = {k: dict(zip(table["unit"], table[k])) for k in ("single", "cond", "comp")}
    s["amp_ratio"] = baselines.amp_ratio(table)
    s["atp_mag"] = _clock(times, "atp_mag", lambda: baselines.atp_mag(bridge, tokens, cands, metric, 1))
    s["cond_grad"] = _clock(times, "cond_grad", lambda: baselines.cond_grad(bridge, tokens, cands, prim, metric, 1))
    s["eap_ig"] = _clock(times, "eap_ig", lambda: baselines.eap_ig(bridge, tokens, cands, metric, args.ig_steps, 1))
    s["atp_star"] = _clock(
        times, "atp_star", lambda: baselines.atp_star_graddrop(bridge, tokens, cands, metric, logits_to_keep=1)
    )
    star_s = _clock(
        times,
        "atp_star_s",
        lambda: baselines.atp_star_graddrop(bridge, tokens, cands, metric, ablate=prim, logits_to_keep=1),
    )
    s["atp_2s"] = {u: s["cond_grad"][u] - s["atp_mag"][u] for u in s["atp_mag"]}
    s["atp_star_2s"] = {u: star_s[u] - s["atp_star"][u] for u in s["atp_star"]}
    return s, times


def token_check(tok, peer_tokens: dict, n: int) -> dict:
    """Prompts whose token ids (and IO, S ids) differ between the release and each of our
    two prompt paths, per seed; and how many were compared."""
    diff = {"gpt2_prompts": 0, "lm_prompts": 0}
    total = 0
    for seed, rows in peer_tokens.items():
        for name, pr in (
            ("gpt2_prompts", ioi.gpt2_prompts(tok, n, int(seed), style="authors")),
            ("lm_prompts", lms.lm_prompts(tok, n, int(seed), ioi.adds_bos(tok))),
        ):
            for b, (ids, io, s) in enumerate(rows):
                mine = [pr.tokens[b].tolist(), int(pr.io[b]), int(pr.s[b])]
                diff[name] += mine != [ids, io, s]
        total += len(rows)
    return {"compared": total, **diff}


def run_peer(args, spec: dict, work: Path, r: int) -> dict:
    """One round of the peer's side under its interpreter (one thread, niced like ours)."""
    spec = {**spec, "out": str(work / f"peer{r}.json")}
    (work / "spec.json").write_text(json.dumps(spec))
    env = peer_harness.peer_env(args.threads)
    env.pop("PYTHONPATH", None)
    cmd = [args.peer_python, str(Path(__file__).resolve()), "--peer-side", str(work / "spec.json")]
    subprocess.run(cmd, check=True, env=env)
    return json.loads(Path(spec["out"]).read_text())


def compare(mine: dict, theirs: list[float], units: list[str], labels: list[int], k: int) -> dict:
    """One score's agreement: max relative and absolute difference, Spearman, top-k overlap, our AUC."""
    a = np.array([mine[u] for u in units], float)
    b = np.array(theirs, float)
    scale = float(np.nanmax(np.abs(b)))
    top = lambda v: set(np.argsort(-np.nan_to_num(v, nan=0.0), kind="stable")[:k])  # noqa: E731
    return {
        "max_rel_diff": float(np.nanmax(np.abs(a - b)) / scale) if scale > 0 else float("nan"),
        "max_abs_diff": float(np.nanmax(np.abs(a - b))),
        "max_abs_score": scale,
        "spearman": float(stats.spearmanr(a, b).statistic),
        "top_k": k,
        "top_k_same": len(top(a) & top(b)),
        "auc_ours": roc_auc(np.nan_to_num(a, nan=0.0), labels),
    }


def rounds(args, bridge, prompts, prim, cands, spec, work) -> tuple[dict, dict, list, list]:
    """``--repeats`` interleaved rounds (ours then the peer's, the order swapped every
    round): the last scores of each and every round's times."""
    mine = theirs = None
    t_ours, t_peer = [], []
    for r in range(args.repeats):
        for side in ("ours", "peer") if r % 2 == 0 else ("peer", "ours"):
            if side == "ours":
                mine, t = ours(bridge, prompts, prim, cands, args)
                t_ours.append(t)
            else:
                theirs = run_peer(args, spec, work, r)
                t_peer.append(theirs["times"])
            last = (t_ours if side == "ours" else t_peer)[-1]
            print(f"round {r} {side}: " + ", ".join(f"{m} {v['wall']:.1f}s" for m, v in last.items()), flush=True)
    return mine, theirs, t_ours, t_peer


# the timed call(s) behind each score (the coax call gives single, cond, comp and amp_ratio)
TIMED_AS = {
    "single": ("coax",), "cond": ("coax",), "comp": ("coax",), "amp_ratio": ("coax",), "atp_mag": ("atp_mag",),
    "cond_grad": ("cond_grad",), "atp_2s": ("atp_mag", "cond_grad"), "eap_ig": ("eap_ig",),
    "atp_star": ("atp_star",), "atp_star_2s": ("atp_star", "atp_star_s"),
}  # fmt: skip


def seconds(rounds_: list[dict], calls: tuple, what: str) -> float:
    """The fewest over the rounds of the ``what`` seconds (wall or cpu) of ``calls`` together."""
    return min(sum(t[c][what] for c in calls) for t in rounds_)


def table_of(args, mine, theirs, t_ours, t_peer, units, labels, meta) -> pd.DataFrame:
    """One row per score: agreement, both AUCs, both codes' fewest seconds and their ratios."""
    rows = []
    for name in SCORES:
        calls = TIMED_AS[name]
        row = {"score": name, **compare(mine[name], theirs["scores"][name], units, labels, args.top_k)}
        row["auc_theirs"] = theirs["auc"][name]
        row["timed_as"] = "+".join(calls)
        for side, ts in (("ours", t_ours), ("theirs", t_peer)):
            for what in ("wall", "cpu"):
                row[f"{what}_{side}"] = seconds(ts, calls, what)
        row["wall_ratio"] = row["wall_ours"] / row["wall_theirs"]
        row["cpu_ratio"] = row["cpu_ours"] / row["cpu_theirs"]
        row["load"] = float(np.mean([t[c]["load"] for t in t_ours + t_peer for c in calls]))
        rows.append(row)
    return pd.DataFrame(rows).assign(**meta)


def main():
    ap = peer_harness.arguments(__doc__, "peers_coax_lm.csv")
    ap.add_argument("--peer-repo", default=str(PEER_REPO), help="the release's checkout (commit 33f1f02)")
    ap.add_argument("--peer-python", default=str(PEER_PYTHON), help="the interpreter of the release's environment")
    ap.add_argument("--peer-commit", default=PEER_COMMIT, help="the checkout's commit when it is no git clone")
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--n-bos", type=int, default=8)
    ap.add_argument("--n-truth", type=int, default=2)
    ap.add_argument("--truth-seed", type=int, default=5)
    ap.add_argument("--n-prompts", type=int, default=2)
    ap.add_argument("--data-seed", type=int, default=1)
    ap.add_argument("--n-primary", type=int, default=3)
    ap.add_argument("--backup-share", type=float, default=0.06)
    ap.add_argument("--ig-steps", type=int, default=5)
    ap.add_argument("--max-rows", type=int, default=256)
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--check-seeds", type=int, nargs="+", default=[1, 5, 8, 15, 22])
    ap.add_argument("--check-prompts", type=int, default=96)
    args = ap.parse_args()
    threads = peer_harness.start(args)
    peer_harness.need(args.peer_repo, args.peer_python)
    bridge, tok, bos, prompts, prim, back, cands = setup(args)
    units = [h.name for h in cands]
    labels = [int(h in back) for h in cands]
    n_heads = int(bridge.cfg.n_heads)
    work = Path(tempfile.mkdtemp(prefix="peers_coax_"))
    spec = {
        "repo": str(Path(args.peer_repo).resolve()), "model": str(adapted_folder(args.model, work / "model")),
        "threads": threads, "n_prompts": args.n_prompts, "data_seed": args.data_seed,
        "primaries": [[h.layer, h.head] for h in prim], "candidates": [h.layer * n_heads + h.head for h in cands],
        "labels": labels, "check_seeds": args.check_seeds, "check_prompts": args.check_prompts,
    }  # fmt: skip
    mine, theirs, t_ours, t_peer = rounds(args, bridge, prompts, prim, cands, spec, work)
    meta = _meta(args, threads, bos, prim, back, cands, token_check(tok, theirs["tokens"], args.check_prompts))
    meta["data_prompts_identical"] = theirs["data_tokens"] == prompts.tokens.tolist()
    t = table_of(args, mine, theirs, t_ours, t_peer, units, labels, meta)
    logits = pd.DataFrame([{"score": "logits", **_logits_row(bridge, prompts, theirs)}]).assign(**meta)
    peer_harness.write(pd.concat([logits, t], ignore_index=True), args)


def _logits_row(bridge, prompts, theirs) -> dict:
    """The clean last-position logits of both codes on the data prompts."""
    last = [prompts.tokens.shape[1] - 1]
    with torch.no_grad():
        a = Prefix(bridge, prompts.tokens, positions=last).logits(last)[:, -1].float().numpy()
    b = np.array(theirs["last_logits"], float)
    scale = float(np.abs(b).max())
    return {
        "max_rel_diff": float(np.abs(a - b).max() / scale),
        "max_abs_diff": float(np.abs(a - b).max()),
        "max_abs_score": scale,
    }


def _meta(args, threads, bos, prim, back, cands, tokens) -> dict:
    """The run's constants, one value per run (every row carries them)."""
    return {
        "model": Path(args.model).parent.name if Path(args.model).name == "model" else Path(args.model).name,
        "n_prompts": args.n_prompts, "data_seed": args.data_seed, "n_truth": args.n_truth,
        "truth_seed": args.truth_seed, "bos": bos, "primaries": " ".join(h.name for h in prim),
        "n_candidates": len(cands), "n_backups": len(back), "backups": " ".join(h.name for h in back),
        "prompts_compared": tokens["compared"], "prompts_differ_gpt2_prompts": tokens["gpt2_prompts"],
        "prompts_differ_lm_prompts": tokens["lm_prompts"], "threads": threads, "repeats": args.repeats,
        "machine": peer_harness.machine(), "commit": peer_harness.commit(), "peer_commit": _peer_commit(args),
        "date": time.strftime("%Y-%m-%d"),
    }  # fmt: skip


def _peer_commit(args) -> str:
    """The peer checkout's commit when it is a git clone of its own, else ``--peer-commit``."""
    git = ["git", "-C", args.peer_repo, "rev-parse"]
    top = subprocess.run([*git, "--show-toplevel"], capture_output=True, text=True).stdout.strip()
    if top and Path(top).resolve() == Path(args.peer_repo).resolve():
        return subprocess.run([*git, "HEAD"], capture_output=True, text=True).stdout.strip()
    return args.peer_commit


if __name__ == "__main__":
    main()
