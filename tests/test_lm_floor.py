"""The executed-work floor of the real-LM rules (benchmarks/bench_lm_floor.py): a job
counts its matmul FLOPs when the environment asks (``runtime.count_flops``), checked on
products whose FLOPs are worked out by hand; and the benchmark's rows from a job's
``benchmark:`` file and its FLOP line, by hand."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_lm_floor  # noqa: E402

from selfrepair.core import runtime  # noqa: E402

JOB = """
import sys, torch
from selfrepair.core import runtime
runtime.JOB = {"rule": "coax_lm", "wildcards": {"lm": "m"}}
print(runtime.count_flops(sys.argv[1]), runtime.count_flops(sys.argv[1]))
a, b = torch.randn(3, 5), torch.randn(5, 7)
(a @ b).sum()
lin = torch.nn.Linear(7, 2)
x = torch.randn(4, 7, requires_grad=True)
lin(x).sum().backward()
torch.autograd.grad(lin(x).sum(), [x])  # a leaf: FlopCounterMode's module hooks refused it
"""


def test_a_job_counts_its_matmul_flops_into_the_file(tmp_path):
    out = tmp_path / "flops.jsonl"
    out.write_text('{"rule": "earlier"}\n')
    r = subprocess.run([sys.executable, "-c", JOB, str(out)], capture_output=True, text=True, check=True)
    assert r.stdout.split() == ["True", "False"]  # once per process
    lines = out.read_text().splitlines()
    assert json.loads(lines[0]) == {"rule": "earlier"}  # appended, nothing lost
    line = json.loads(lines[1])
    assert line["rule"] == "coax_lm" and line["wildcards"] == {"lm": "m"} and line["cpu_s"] > 0
    # [3,5]x[5,7]: 2*3*5*7; the linear layer [4,7]x[7,2] forward, then its weight's and
    # its input's gradients backward, each 2*4*7*2; then forward and the input's gradient
    assert line["flops"] == 2 * 3 * 5 * 7 + 3 * (2 * 4 * 7 * 2) + 2 * (2 * 4 * 7 * 2)


def test_a_failed_job_writes_no_line(tmp_path):
    out = tmp_path / "flops.jsonl"
    code = JOB + "\nraise ValueError('the job failed')\n"
    r = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True)
    assert r.returncode != 0 and "the job failed" in r.stderr
    assert not out.exists()  # a partial count is no count


def test_no_counting_without_a_file():
    assert runtime.count_flops(None) is False and runtime.count_flops("") is False


def test_rows_by_hand(tmp_path):
    tsv = tmp_path / "benchmarks" / "coax" / "lms" / "m" / "run.tsv"
    tsv.parent.mkdir(parents=True)
    tsv.write_text("s\th:m:s\tmax_rss\tcpu_time\n130.0\t0:02:10\t1024.0\t120.0\n")
    cpu = bench_lm_floor.plain_cpu(tmp_path, ["coax_lm"], ["m"])
    assert cpu == {("coax_lm", "m"): 120.0}
    with pytest.raises(SystemExit, match="no benchmark: file of"):
        bench_lm_floor.plain_cpu(tmp_path, ["coax_lm"], ["m", "absent"])
    counted = {("coax_lm", "m"): {"flops": 3e12, "cpu_s": 250.0}}
    (row,) = bench_lm_floor.floor_rows(["coax_lm"], ["m"], cpu, counted, 50e9)
    assert row["cpu_s"] == 120.0 and row["gflop"] == 3000.0
    assert row["floor_s"] == 60.0 and row["over_floor"] == 2.0  # 3e12 / 50e9 = 60 s; 120 / 60
    assert row["cpu_s_counting"] == 250.0
    with pytest.raises(SystemExit, match="no FLOP line"):
        bench_lm_floor.floor_rows(["coax_lm"], ["m"], cpu, {}, 50e9)


def test_flops_lines_by_rule_and_model(tmp_path):
    f = tmp_path / "flops.jsonl"
    lines = [{"rule": "gim_lm", "wildcards": {"lm": "a"}, "flops": 1.0, "cpu_s": 1.0},
             {"rule": "gim_lm", "wildcards": {"lm": "b"}, "flops": 2.0, "cpu_s": 1.0}]  # fmt: skip
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    got = bench_lm_floor.flops_lines(f)
    assert set(got) == {("gim_lm", "a"), ("gim_lm", "b")} and got[("gim_lm", "b")]["flops"] == 2.0
    assert bench_lm_floor.flops_lines(tmp_path / "absent.jsonl") == {}


def test_the_small_sizes_are_valid_config():
    """The sizes the benchmark merges over config/config.yaml pass the schemas, merged as
    Snakemake merges config files (a misspelt key would fail here, not measure the default)."""
    import yaml
    from snakemake.utils import update_config

    from selfrepair.core import config_schema

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    update_config(config, yaml.safe_load(bench_lm_floor.SMALL))
    for section in ("coax", "gim", "groundtruth"):
        schema = yaml.safe_load((ROOT / "workflow" / "schemas" / f"{section}.schema.yaml").read_text())
        assert config_schema.problems(config[section], schema) == [], section
    assert config["coax"]["lms"]["default"]["n_truth"] == 4 and config["gim"]["lms"]["n_eval"] == 4


def test_the_count_is_torchs_flop_counter_total():
    """One counter for the jobs and the benchmarks (core.flops), whose totals are torch's
    FlopCounterMode's (the same formulas) on a layer's forward and backward."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from selfrepair.core import flops

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    x = torch.randn(3, 5, 16)

    def work():
        layer(x).square().sum().backward()

    reference = FlopCounterMode(display=False)
    with reference:
        work()
    assert reference.get_total_flops() > 0
    assert flops.executed(work) == float(reference.get_total_flops())


def test_before_and_after_run_side_by_side_in_turn(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(bench_lm_floor, "snakemake", lambda work, cfg, targets, extra, env, code: calls.append(
        (work.name, targets[0], extra, env.get("PYTHONPATH"))))  # fmt: skip
    monkeypatch.setattr(bench_lm_floor, "plain_cpu", lambda work, rules, models: {(rules[0], models[0]): len(calls)})
    sides = {"after": (ROOT, tmp_path / "after", {}), "before": (tmp_path / "old", tmp_path / "before",
                                                                 {"PYTHONPATH": "old/src"})}  # fmt: skip
    cpu = bench_lm_floor.plain_runs(sides, {"after": [], "before": []}, ["gim_lm"], ["a", "b", "c"], {})
    assert [(w, t.split("/")[3]) for w, t, _, _ in calls] == [
        ("after", "a"), ("before", "a"), ("before", "b"), ("after", "b"), ("after", "c"), ("before", "c")]  # fmt: skip
    assert all(extra == ["--forcerun", "gim_lm"] for _, _, extra, _ in calls)
    assert [p for w, _, _, p in calls if w == "before"] == ["old/src"] * 3  # the old code first on the path
    assert cpu == {"after": {("gim_lm", "a"): 1, ("gim_lm", "b"): 4, ("gim_lm", "c"): 5},
                   "before": {("gim_lm", "a"): 2, ("gim_lm", "b"): 3, ("gim_lm", "c"): 6}}  # fmt: skip


def test_rows_with_a_before_by_hand():
    counted = {("gim_lm", "m"): {"flops": 3e12, "cpu_s": 250.0}}
    (row,) = bench_lm_floor.floor_rows(["gim_lm"], ["m"], {("gim_lm", "m"): 90.0}, counted, 50e9,
                                       before={("gim_lm", "m"): 120.0})  # fmt: skip
    assert row["over_floor"] == 1.5 and row["cpu_s_before"] == 120.0  # 90 / 60 s
    assert row["over_floor_before"] == 2.0 and row["after_over_before"] == 0.75


def test_before_names_a_commit_or_stops_clearly():
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    assert bench_lm_floor.short("HEAD") == head.stdout.strip()
    with pytest.raises(SystemExit, match="--before no-such-rev: no such commit"):
        bench_lm_floor.short("no-such-rev")
