"""Papers A, B and C's tiny DAGs through a real SLURM: a one-node cluster on this machine
(tests/cluster/start-slurm.sh; .ci/run starts it before `make test`), submitted with the
workflow's own profile (workflow/profiles/slurm) by Snakemake's SLURM executor plugin.

The three tiny DAGs' config runs twice, both scoring the committed checkpoints of
tests/golden (nothing trains), both in the config's numerics mode: locally, the whole DAG
(--cores 2: the session's shared run, tiny_runs in tests/conftest.py, which other modules
read too, asked for after the SLURM run: under two pytest workers the other worker makes
it meanwhile), and through SLURM, SLURM_TARGETS: papers B and C whole, and of paper A's
and the ground truth's per-model rules one model each, so that every rule that is not a
localrule goes through sbatch at least once without paper A's per-model jobs running four
to eight times over. During the SLURM run one job of CANCEL_RULE is cancelled with
scancel while it runs; the same command then runs again. Checked:
- every job that is not a localrule went through sbatch: the log names its SLURM job id,
  and squeue shows that job, named after this run, completed, with as many CPUs as its
  rule's threads (1 in the pinned modes) and no GPU; no compute job ran locally; every
  rule of the local run's DAG that is not a localrule had a job through SLURM;
- every file the SLURM run wrote under results/ (papers B and C's every one among them)
  is byte for byte the local run's, timings (TIMINGS) aside;
- the cancelled job failed the run loudly (its SLURM id and state CANCELLED in the
  error; the other jobs finished), and the rerun completed it.
What the module costs under make test's two workers: docs/TESTING.md.
And, in seconds: with --config device=cuda a job's sbatch asks for a GPU (which the
CPU-only test cluster refuses).

Without a cluster (no sinfo, or no node up) these tests skip and say how to start one;
SELFREPAIR_REQUIRE_SLURM=1 (.ci/run sets it) turns that skip into a failure.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

import golden_suite as G
from selfrepair.tooling.run_state import parse_run_log

ROOT = G.ROOT
PAPERS = G.ALL_PAPERS
# The README's command on the test cluster: the profile, polled with squeue (the test
# cluster keeps no accounting, so there is no sacct).
SLURM_ARGS = ["--workflow-profile", "workflow/profiles/slurm", "--slurm-status-command", "squeue"]
# Here only: the first status check 2 s after a submission, not the plugin's 40 s (the
# tiny jobs take seconds; a site's take minutes).
QUICK_POLL = ["--slurm-init-seconds-before-status-checks", "2"]
# A compute job with little downstream, cancelled while it runs.
CANCEL_RULE = "gim_selfrepair"
# What the SLURM run asks for: papers B and C's published tables and figures (their whole
# DAGs), paper A's probe of one model (ood, scores, probe), one protocol-grid cell on a
# grid-trained model (grid_ood, grid_measure), and the ground truth of one model of each
# family. The localrules (paper A's and the ground truth's tables and figures) run in the
# local run only.
SLURM_TARGETS = [
    "results/published/coax.csv",
    *(
        f"results/coax/figures/{f}.png"
        for f in ("discovery", "induction", "knockout", "pruning", "synthetic", "wakeup")
    ),
    "results/published/gim.csv",
    "results/gim/figures/faithfulness.png",
    "results/gim/figures/selfrepair.png",
    "results/gim/tables/speed.csv",
    "results/heroes/sort/seed42/redundancy.csv",
    "results/heroes/grid/measure/per_example-torch/sort/seed42/components.csv",
    "results/groundtruth/models/heroes/sort/seed42/shapley.csv",
    "results/groundtruth/models/ioi/seed1/shapley.csv",
    "results/groundtruth/models/gim/arithmetic/tiny/seed1/shapley.csv",
]
# Files whose bytes are wall-clock timings (the rest must match the local run's): these,
# and every timing.csv of the ground truth's models.
TIMINGS = {"results/gim/tables/speed.csv", "results/groundtruth/tables/runtime.csv"}
REQUIRE = os.environ.get("SELFREPAIR_REQUIRE_SLURM") == "1"
TIMEOUT = 5400
START = "tests/cluster/start-slurm.sh"


def _cluster_problem() -> str | None:
    """Why no SLURM cluster can take jobs here, or None."""
    if shutil.which("sinfo") is None:
        return f"no SLURM client here (sinfo): start a one-node cluster with {START} (as root)"
    r = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        return f"sinfo failed ({r.stderr.strip()}): start a one-node cluster with {START} (as root)"
    states = [s.rstrip("*~#$@^-") for s in r.stdout.split()]
    if not set(states) & {"idle", "mixed", "allocated", "completing"}:
        return f"no SLURM node takes jobs (sinfo states: {states}): see {START}"
    return None


@pytest.fixture(scope="module")
def cluster():
    problem = _cluster_problem()
    if problem is not None:
        if REQUIRE:
            pytest.fail(f"SELFREPAIR_REQUIRE_SLURM=1, but {problem}")
        pytest.skip(problem)


def squeue(**select) -> dict[str, dict]:
    """{SLURM job id: its fields} as squeue shows them, finished jobs too (for the
    cluster's MinJobAge); select: jobs=[ids] or name=run id."""
    fields = ("state", "name", "comment", "cpus", "gres", "workdir")
    args = ["squeue", "-h", "--states=all", "--format=%i|%T|%j|%k|%C|%b|%Z"]
    if "jobs" in select:
        args += ["--jobs", ",".join(select["jobs"])]
    if "name" in select:
        args += ["--name", select["name"]]
    r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{shlex.join(args)} failed: {r.stderr}"
    out = {}
    for line in r.stdout.splitlines():
        jid, *rest = line.split("|")
        out[jid] = dict(zip(fields, rest))
    return out


def _rule_of(comment: str) -> str:
    """The rule of a job from the comment the plugin gives it (rule_<name>[_wildcards_...])."""
    return re.sub(r"_wildcards_.*$", "", comment.removeprefix("rule_"))


def _run_id(log: str) -> str | None:
    m = re.search(r"SLURM run ID: (\S+)", log)
    return m.group(1) if m else None


def _slurm_run(d: Path, log: Path, cancel: str | None = None) -> SimpleNamespace:
    """The SLURM run of SLURM_TARGETS in ``d`` (output in ``log``); with ``cancel``, the
    first job of that rule is cancelled (scancel) as soon as squeue shows it running."""
    cmd = [str(G.BIN / "snakemake"), "-s", str(ROOT / "Snakefile"), *SLURM_ARGS, *QUICK_POLL,
           *G.tiny_args(d, paper=PAPERS), "--", *SLURM_TARGETS]  # fmt: skip
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    t0 = time.monotonic()
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    cancelled = run_id = None
    try:
        while cancel and cancelled is None and p.poll() is None and time.monotonic() - t0 < TIMEOUT:
            run_id = run_id or _run_id(log.read_text())
            if run_id:
                for jid, j in squeue(name=run_id).items():
                    if _rule_of(j["comment"]) == cancel and j["state"] == "RUNNING":
                        subprocess.run(["scancel", jid], check=True, timeout=60)
                        cancelled = jid
                        break
            time.sleep(0.2)
        p.wait(timeout=max(1, TIMEOUT - (time.monotonic() - t0)))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        run_id = run_id or _run_id(log.read_text())
        if run_id:  # nothing of this run stays queued
            subprocess.run(["scancel", "--name", run_id], timeout=60)
    text = log.read_text()
    return SimpleNamespace(rc=p.returncode, out=text, run_id=_run_id(text), cancelled=cancelled,
                           seconds=time.monotonic() - t0)  # fmt: skip


@pytest.fixture(scope="module")
def runs(cluster, request, tmp_path_factory):
    base = tmp_path_factory.mktemp("slurm")
    remote = G.prepare(base / "slurm")
    G.seed_checkpoints(remote, G.PAPERS)
    first = _slurm_run(remote, base / "slurm_first.log", cancel=CANCEL_RULE)
    assert first.cancelled, f"no running {CANCEL_RULE} job seen to cancel:\n{first.out[-3000:]}"
    trained = [t for p in G.PAPERS for t in G.ran_training(first.out, p)]
    assert not trained, f"the SLURM run retrained committed checkpoints: {trained}"
    rerun = _slurm_run(remote, base / "slurm_rerun.log")
    print(f"\ntiny DAGs of {PAPERS}: SLURM {first.seconds:.0f} s + rerun {rerun.seconds:.0f} s")
    # The local run, asked for after the SLURM run: the session's shared one
    # (tests/conftest.py, the same command), which the other worker makes meanwhile
    # (tests/test_workflow.py asks for it first), so neither waits for the other.
    local = request.getfixturevalue("tiny_runs")
    return SimpleNamespace(local=local, remote=remote, first=first, rerun=rerun)


def _submitted(out: str) -> dict[str, str]:
    """{SLURM job id: Snakemake job id} of every submission the log names."""
    return {s: j for j, s in re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+)", out)}


def _job_blocks(out: str) -> list[tuple[str, str, str]]:
    """(rule or localrule, rule name, the job's block) of every job the log starts."""
    parts = re.split(r"^(localrule|rule) (\w+):$", out, flags=re.M)
    return [(parts[i], parts[i + 1], parts[i + 2]) for i in range(1, len(parts) - 2, 3)]


@pytest.mark.slow
def test_every_remote_job_went_through_slurm(runs):
    for run in (runs.first, runs.rerun):
        ids = _submitted(run.out)
        blocks = _job_blocks(run.out)
        remote = sorted(name for kind, name, _ in blocks if kind == "rule")
        assert ids and len(ids) == len(remote), f"{len(remote)} remote jobs but {len(ids)} SLURM submissions"
        jobs = squeue(jobs=list(ids))
        assert set(jobs) == set(ids), f"squeue does not show SLURM jobs {set(ids) - set(jobs)}"
        assert sorted(_rule_of(j["comment"]) for j in jobs.values()) == remote
        for jid, j in jobs.items():
            assert j["name"] == run.run_id, (jid, j)
            assert Path(j["workdir"]) == runs.remote, (jid, j)
            assert j["state"] == ("CANCELLED" if jid == run.cancelled else "COMPLETED"), (jid, j)
            # the pinned numerics modes run one thread per job: one CPU, and no GPU asked
            assert (j["cpus"], j["gres"]) == ("1", "N/A"), (jid, j)
        local_compute = [name for kind, name, block in blocks if kind == "localrule" and "benchmark:" in block]
        assert not local_compute, f"compute jobs ran on the submitting node: {local_compute}"
    rules = {_rule_of(j["comment"]) for j in squeue(name=runs.first.run_id).values()}
    for r in ("heroes_ood", "heroes_scores", "heroes_grid_measure", "coax_ioi_run", "gim_localize", "groundtruth_gim"):
        assert r in rules, f"no {r} job went through SLURM: {sorted(rules)}"
    # every rule of the whole tiny DAG (the local run's log) but the workflow's localrules,
    # in the first run or in the rerun (the cancelled job's downstream runs there)
    rules |= {_rule_of(j["comment"]) for j in squeue(name=runs.rerun.run_id).values()}
    (local_log,) = (runs.local / ".snakemake" / "log").glob("*.snakemake.log")
    dag = {j.rule for j in parse_run_log(local_log.read_text()).jobs.values()} - {"all"}
    locals_ = _localrules(runs.remote)
    assert {"heroes_roles", "heroes_aggregate", "published_summary"} <= locals_, sorted(locals_)
    missing = dag - locals_ - rules
    assert not missing, (
        f"rules of the tiny DAG that no job took through SLURM (add to SLURM_TARGETS): {sorted(missing)}"
    )
    assert len(rules) >= 25, sorted(rules)


# The workflow's localrules, as Snakemake itself reads the Snakefile (its API; a separate
# Python, for the API changes the working directory).
LOCALRULES = """
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings, StorageSettings
root, workdir, papers, *configs = sys.argv[1:]
with SnakemakeApi(OutputSettings(quiet=True)) as api:
    wf = api.workflow(resource_settings=ResourceSettings(cores=1),
                      config_settings=ConfigSettings(configfiles=[Path(c) for c in configs],
                                                     config={"papers": papers.split(","), "device": "cpu"}),
                      storage_settings=StorageSettings(), snakefile=Path(root) / "Snakefile", workdir=Path(workdir))
    print(json.dumps(sorted(wf._workflow._localrules)))
"""


def _localrules(d: Path) -> set[str]:
    r = subprocess.run([str(G.BIN / "python"), "-c", LOCALRULES, str(ROOT), str(d), PAPERS, *map(str, G.TINY_CONFIGS)],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, HF_HUB_OFFLINE="1"))  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return set(json.loads(r.stdout.strip().splitlines()[-1]))


def _is_timing(rel: str) -> bool:
    return rel in TIMINGS or (rel.startswith("results/groundtruth/models/") and rel.endswith("/timing.csv"))


@pytest.mark.slow
def test_outputs_are_the_local_runs_byte_for_byte(runs):
    def files(d):
        return {str(p.relative_to(d)): p for p in sorted((d / "results").rglob("*")) if p.is_file()}

    local, remote = files(runs.local), files(runs.remote)
    assert set(remote) <= set(local), f"only SLURM: {sorted(set(remote) - set(local))[:10]}"
    whole = [f for f in local if f.startswith(("results/coax/", "results/gim/"))]
    assert set(whole) <= set(remote), (
        f"papers B and C's files not in the SLURM run: {sorted(set(whole) - set(remote))[:10]}"
    )
    differ = [f for f in remote if local[f].read_bytes() != remote[f].read_bytes() and not _is_timing(f)]
    assert not differ, f"{len(differ)} of {len(remote)} files differ from the local run's: {differ[:20]}"
    assert len(whole) > 60 and len(remote) > len(whole) + 20, (len(whole), len(remote))


@pytest.mark.slow
def test_a_cancelled_job_fails_loudly_and_a_rerun_completes_it(runs):
    first, rerun = runs.first, runs.rerun
    assert first.rc != 0, "the run with a cancelled job exited 0"
    assert f"Error in rule {CANCEL_RULE}" in first.out, first.out[-3000:]
    assert f"SLURM-job '{first.cancelled}' failed, SLURM status is: 'CANCELLED'" in first.out, first.out[-3000:]
    assert squeue(jobs=[first.cancelled])[first.cancelled]["state"] == "CANCELLED"
    assert rerun.rc == 0, rerun.out[-3000:]
    again = {_rule_of(j["comment"]) for j in squeue(jobs=list(_submitted(rerun.out))).values()}
    assert CANCEL_RULE in again, f"the rerun did not submit {CANCEL_RULE} again: {sorted(again)}"
    # keep-going: every other remote job of the first run finished there, not in the rerun
    assert not again & {"heroes_ood", "coax_ioi_run", "gim_localize"}, sorted(again)


@pytest.mark.slow
def test_device_cuda_asks_slurm_for_a_gpu(cluster, tmp_path):
    """The documented GPU override: with --config device=cuda a compute job's sbatch asks
    for one GPU, which the CPU-only test cluster refuses before anything runs."""
    d = G.prepare(tmp_path)
    target = "results/coax/synthetic/auc.csv"
    r = G.snakemake(*SLURM_ARGS, *QUICK_POLL, *G.tiny_args(d, paper="coax"), "device=cuda",
                    "--allowed-rules", "coax_synthetic", "--", target, check=False, timeout=600)  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "Error in rule coax_synthetic" in out, out[-3000:]
    call = re.search(r"sbatch call:\s+(sbatch .*)", out)
    assert call and " --gpus=1 " in call.group(1) and "--cpus-per-task=1" in call.group(1), out[-3000:]
    assert "Invalid generic resource (gres) specification" in out, out[-3000:]


def test_the_profile_asks_for_no_gpu_and_no_fixed_threads():
    """A CPU partition out of the box: GPUs only through --config device=cuda, CPUs per
    job from the rules' threads (the numerics mode), not fixed in the profile."""
    p = yaml.safe_load((ROOT / "workflow/profiles/slurm/profile.yaml").read_text())
    resources = [*p.get("default-resources", {}), *(k for r in p.get("set-resources", {}).values() for k in r)]
    assert not {"gpu", "gres", "cpus_per_task", "cpus_per_gpu"} & set(resources), resources
    assert "config" not in p, "a profile's config is dropped by any --config on the command line"


def test_the_readme_gives_the_commands_run_here():
    readme = (ROOT / "README.md").read_text()
    assert START in readme
    assert f"snakemake {shlex.join(SLURM_ARGS)}" in " ".join(readme.split())
