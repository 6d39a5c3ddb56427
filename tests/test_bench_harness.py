"""benchmarks/harness.py, the shape every benchmark shares: its options, the order of
interleaved repeats, the compute-floor arithmetic against values worked out by hand, and
the CSV with its reference copy rendered into a doc block; that the benchmarks go
through it (and the peers' comparisons, through peers/peer_harness.py, which imports it),
and that every benchmark or peers command the documents and the Makefile give names a
script that exists and options it declares."""

import ast
import re
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import harness  # noqa: E402

from selfrepair.core import numerics  # noqa: E402
from selfrepair.tooling import readme_table  # noqa: E402


def test_arguments_give_the_shared_options_and_their_defaults():
    a = harness.arguments("doc", "x.csv", threads=2).parse_args([])
    assert a.threads == 2 and a.numerics == numerics.DEFAULT_MODE and a.write is False
    assert Path(a.out) == ROOT / "results" / "benchmarks" / "x.csv"
    a = harness.arguments("doc", "x.csv").parse_args(["--threads", "3", "--numerics", "exact", "--write", "--out", "o"])
    assert (a.threads, a.numerics, a.write, a.out) == (3, "exact", True, "o")
    bare = harness.arguments("doc", "x.csv", threads=None, modes=False).parse_args([])
    assert not hasattr(bare, "threads") and not hasattr(bare, "numerics")
    with pytest.raises(SystemExit):  # not a mode
        harness.arguments("doc", "x.csv").parse_args(["--numerics", "turbo"])


def test_interleaved_rotates_the_order_each_round():
    log = []
    calls = {n: (lambda n=n: log.append(n) or n.upper()) for n in "abc"}
    got = list(harness.interleaved(calls, 4))
    assert "".join(log) == "abc" + "bca" + "cab" + "abc"
    assert [r for r, _, _ in got] == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    assert all(out == name.upper() for _, name, out in got)
    assert list(harness.interleaved(calls, 0)) == []


def test_best_of_keeps_each_calls_fewest_seconds(monkeypatch):
    seconds = iter([5.0, 1.0, 2.0, 4.0, 3.0, 0.5])  # rounds: a b | b a | a b
    monkeypatch.setattr(harness, "timed", lambda f: (f(), next(seconds)))
    best = harness.best_of({"a": lambda: "A", "b": lambda: "B"}, 3)
    assert best == {"a": (3.0, "A"), "b": (0.5, "B")}
    # another clock (cpu_timed's place): the same rule over its seconds
    cpu = iter([2.0, 1.0, 3.0, 0.25])  # rounds: a b | b a
    best = harness.best_of({"a": lambda: "A", "b": lambda: "B"}, 2, lambda f: (f(), next(cpu)))
    assert best == {"a": (0.25, "A"), "b": (1.0, "B")}


def test_floor_ratios_by_hand():
    # 6 GFLOP at 4 GFLOP/s: a 1.5 s floor; 2 s is 4/3 of it. Half the work executed:
    # 0.75 s of matmul time, so 2 s is 8/3 of that.
    r = harness.floor_ratios(2.0, 6e9, 3e9, 4e9)
    assert r == pytest.approx({"floor_s": 1.5, "over_floor": 4 / 3, "executed_fraction": 0.5, "over_executed": 8 / 3})
    assert harness.floor_ratios(1.0, 2.0, float("nan"), 1.0)["over_executed"] != 0  # nan: no count


def test_forward_flops_by_hand():
    class Cfg:
        n_embd, n_layer, n_inner, vocab_size = 4, 2, 8, 10

    # per token: 2 layers x (QKV 2*3*16 + out 2*16 + MLP 2*2*4*8 = 256) + unembedding 2*4*10 = 592;
    # attention per sequence: 2 layers x 2 matmuls x 2 x 5*5*4 / 2 = 400; 3 x (5*592 + 400)
    assert harness.forward_flops(Cfg, 3, 5) == 10080


def test_executed_flops_counts_a_matmul():
    import torch

    a, b = torch.ones(6, 5), torch.ones(5, 7)
    assert harness.executed_flops(lambda: a @ b) == 2 * 6 * 5 * 7
    assert harness.matmul_throughput(seconds=0.01, rows=64, k=8, n=8) > 0


def test_write_the_csv_then_its_reference_copy_rendered_into_its_block(tmp_path, monkeypatch):
    monkeypatch.setattr(readme_table, "REFERENCE", tmp_path / "results" / "reference")
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# x\n")
    doc = tmp_path / "docs" / "RESULTS.md"
    doc.write_text("before\n<!-- benchmark_heroes:start -->\nold\n<!-- benchmark_heroes:end -->\nafter\n")
    table = pd.DataFrame({"part": ["G", "C"], "seconds": [1.5, 0.25]})
    args = harness.arguments("doc", "heroes.csv").parse_args(["--out", str(tmp_path / "b" / "heroes.csv")])
    out = harness.write(table, args, root=tmp_path)
    assert out == tmp_path / "b" / "heroes.csv" and out.read_text() == "part,seconds\nG,1.5\nC,0.25\n"
    assert not (tmp_path / "results").exists() and "old" in doc.read_text()  # no --write: nothing else
    args.write = True
    harness.write(table, args, root=tmp_path)
    assert (tmp_path / "results" / "reference" / "benchmark_heroes.csv").read_text() == out.read_text()
    block = "| part | seconds |\n|---|---|\n| G | 1.5 |\n| C | 0.25 |"
    marked = f"<!-- benchmark_heroes:start -->\n{block}\n<!-- benchmark_heroes:end -->"
    assert doc.read_text() == f"before\n{marked}\nafter\n"
    harness.write(table, args, out=tmp_path / "b" / "second.csv", reference="other", root=tmp_path)
    assert (tmp_path / "results" / "reference" / "other.csv").exists()


def test_write_with_keys_replaces_only_the_rows_measured_again(tmp_path):
    args = harness.arguments("doc", "t.csv", threads=None).parse_args(["--out", str(tmp_path / "t.csv")])
    first = pd.DataFrame({"model": ["m", "m", "n"], "part": ["a", "b", "a"], "s": [1, 2, 3]})
    harness.write(first, args, keys=["model", "part"])
    harness.write(pd.DataFrame({"model": ["m"], "part": ["b"], "s": [9]}), args, keys=["model", "part"])
    got = pd.read_csv(tmp_path / "t.csv")
    assert got.values.tolist() == [["m", "a", 1], ["n", "a", 3], ["m", "b", 9]]


# Scripts of benchmarks/ and peers/ that do not take the harness's shape, and why.
OUTSIDE = {
    "harness.py": "the harness itself",
    "peer_harness.py": "the peers' harness: benchmarks/harness.py's functions, imported",
    "fingerprint.py": "hashes of kernels and operation traces, written as JSON and compared file to file: no table",
    "gpu_bench.py": "runs on the GPU machine before the project is installed; its table is gpu_run.csv in $OUT",
    "gpu_measure.py": "gpu_bench.py's measurements and table",
    "mib_side.py": "MIB's side of peers/mib_lm.py, run by the peers' own environment (no project package there)",
}
# Each folder's scripts and the harness module they call: benchmarks/ with its subfolders,
# peers/ without peers/work/ (the peers' own clones, ignored by git)
HARNESSES = {"benchmarks": ("harness", "**/*.py"), "peers": ("peer_harness", "*.py")}


def harness_scripts():
    """(script, the name of the harness module it must call) of benchmarks/ and peers/."""
    for folder, (module, pattern) in HARNESSES.items():
        for f in sorted((ROOT / folder).glob(pattern)):
            if f.name not in OUTSIDE and "probe" not in f.parts:
                yield f, module


def test_every_benchmark_takes_the_harness_options_and_writes_through_it():
    scripts = list(harness_scripts())
    assert {f.name for f, _ in scripts} >= {"bench_heroes.py", "mib_lm.py", "coax_lm.py"}
    for f, module in scripts:
        calls = {
            f"{n.func.value.id}.{n.func.attr}"
            for n in ast.walk(ast.parse(f.read_text()))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
        }
        assert {f"{module}.arguments", f"{module}.write"} <= calls, f"{f.name} does not go through {module}.py"


def declared_options(script: Path) -> set[str]:
    """The --options a benchmark script's parser declares: its own add_argument calls and
    the shared ones its harness.arguments call asks for."""
    opts = set()
    for n in ast.walk(ast.parse(script.read_text())):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)):
            continue
        if n.func.attr == "add_argument":
            opts |= {a.value for a in n.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")}
        elif n.func.attr == "arguments" and getattr(n.func.value, "id", "") in ("harness", "peer_harness"):
            kw = {k.arg: k.value for k in n.keywords}
            opts |= {"--out", "--write"}
            if not (isinstance(kw.get("threads"), ast.Constant) and kw["threads"].value is None):
                opts.add("--threads")
            if not (isinstance(kw.get("modes"), ast.Constant) and kw["modes"].value is False):
                opts.add("--numerics")
    return opts


def documented_benchmark_commands() -> list[tuple[str, str, list[str]]]:
    """(where, script, words after it) of every command of a script of benchmarks/ or
    peers/ (the script's path from the root) in a code span of README.md, peers/README.md
    or any page under docs/ (over line breaks) and in the Makefile's recipes."""
    found = []
    sources = [
        ROOT / "README.md",
        ROOT / "peers" / "README.md",
        *sorted((ROOT / "docs").rglob("*.md")),
        ROOT / "Makefile",
    ]
    for doc in sources:
        text = doc.read_text()
        fenced = re.findall(r"^\s*```[^\n]*\n(.*?)^\s*```", text, re.M | re.S)
        prose = re.sub(r"^\s*```[^\n]*\n.*?^\s*```", "", text, flags=re.M | re.S)
        pieces = [line for block in fenced for line in block.splitlines()] + re.findall(r"`([^`]+)`", prose)
        pieces = text.splitlines() if doc.name == "Makefile" else pieces
        for piece in pieces:
            for m in re.finditer(r"\b((?:benchmarks|peers)/[\w/]+\.py)((?:[ \t\n]+[^\s`;|]+)*)", piece):
                found.append((str(doc.relative_to(ROOT)), m.group(1), m.group(2).split()))
    return found


def test_every_documented_benchmark_command_names_a_script_and_options_it_takes():
    commands = documented_benchmark_commands()
    for script, option in (("benchmarks/bench_heroes.py", "--n"), ("peers/mib_lm.py", "--cross"),
                           ("peers/coax_lm.py", "--peer-repo")):  # fmt: skip
        assert any(s == script and option in words for _, s, words in commands), f"no documented {script} {option}"
    for where, script, words in commands:
        path = ROOT / script
        assert path.exists(), f"{where} names {script}, which does not exist"
        opts = {w.lstrip("[").split("=")[0].rstrip("]") for w in words if w.lstrip("[").startswith("--")}
        unknown = opts - declared_options(path)
        assert not unknown, f"{where}: {script} takes no {sorted(unknown)}"
