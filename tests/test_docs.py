"""The documents' commands as tested code: every `snakemake ...`, `make ...` and
`python -m ...` command in README.md and docs/**/*.md (a line of a fenced code block, or an
inline code span) plans what its text says.

- snakemake: read with Snakemake's own argument parser, the words meant as targets (paths
  under results/) must be its targets, not swallowed by an option that takes every
  following word (-R/--forcerun, --configfile, --config). Then it is dry-run (`-n` put
  first) from the repository root in an empty working directory holding a copy of
  config/, with the command's own config options: the plan must make every named target
  and run every -R rule, must not build the default target `all` when a target is named,
  and must build `all` with only the papers of `papers=[...]` when none is named.
  `--report X` commands are dry-run without `--report X` (the report covers the plan of
  the same options); `--unlock` and `--summary` run for real there (they run no job).
- make: `make -n` must succeed; every snakemake line of its recipe must carry the
  command's SNAKEMAKE_ARGS and is checked like a snakemake command; a results/ path given
  to a make variable (MODEL=...) must be one the default run writes.
- python -m: the module's --help must list every option the command uses.

A command that cannot be checked this way is in SKIP, with the reason.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from snakemake.cli import get_argument_parser

import golden_suite

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]  # docs/results/, docs/papers/ too

# Commands (as written, comment stripped) that are not run, with the reason.
SKIP = {
    "snakemake --lint": "lints the workflow, plans nothing; tests/test_workflow.py::test_lint_is_clean runs it",
}

# A command: optional VAR=value words, then the program.
_START = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S+\s+)*(?:\.venv/bin/)?(?:snakemake|make|python -m)(?:\s|$)")
_FENCE = re.compile(r"^\s*(```|~~~)")
_SPAN = re.compile(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)?)`(?!`)")  # an inline code span, over one line break at most
_MEANT_TARGET = re.compile(r"^results/\S+$")
_NO_TARGET_OPTIONS = ("--report",)  # options whose value is a results/ path but not a target
_RUN_FOR_REAL = ("--unlock", "--summary", "--detailed-summary")  # run no job: run them as they are


def extract(path: Path) -> list[tuple[int, str]]:
    """(line, command) of every command in one markdown file: the lines of fenced code
    blocks (their `# comment` stripped) and the inline code spans outside them."""
    lines = path.read_text().splitlines()
    found, prose, fenced = [], [], False
    for i, line in enumerate(lines, 1):
        if _FENCE.match(line):
            fenced = not fenced
            prose.append("")
            continue
        if fenced:
            prose.append("")
            cmd = re.sub(r"\s+#\s.*$", "", line.strip())
            if _START.match(cmd):
                found.append((i, cmd))
        else:
            prose.append(line)
    text = "\n".join(prose)
    for m in _SPAN.finditer(text):
        cmd = " ".join(m.group(1).split())
        if _START.match(cmd):
            found.append((text.count("\n", 0, m.start()) + 1, cmd))
    return sorted(found)


COMMANDS = [(f"{p.relative_to(ROOT)}:{line}", cmd) for p in DOCS for line, cmd in extract(p)]


def _env():
    # SELFREPAIR_ASSUME_CUDA: the documents' GPU commands (the gpu profile sets device=cuda)
    # are planned here too, on a machine without CUDA (workflow/rules/common.smk)
    return dict(os.environ, HF_HUB_OFFLINE="1", SELFREPAIR_ASSUME_CUDA="1")


def _split(cmd: str) -> tuple[dict, str, list[str]]:
    """(environment assignments, program, arguments) of a command line."""
    words = shlex.split(cmd, comments=True)
    env = {}
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    prog = words.pop(0)
    if prog == "python" and words[:1] == ["-m"]:
        prog = "python -m"
        words.pop(0)
    return env, Path(prog).name if prog != "python -m" else prog, words


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """An empty working directory as a user would set one up: config/ copied (the
    Snakefile's `configfile:` and config/published.yaml are read from the working
    directory)."""
    d = tmp_path_factory.mktemp("docs_run")
    shutil.copytree(ROOT / "config", d / "config")
    return d


def _snakemake(words, workdir, dry=True, timeout=300, directory=None):
    """Run snakemake from the repository root as the documents do, in ``workdir``; a
    command that names its own --directory gets ``directory`` instead, by default an empty
    folder in ``workdir`` (a fresh folder, as a user would give it)."""
    words = list(words)
    for opt in ("--directory", "-d"):
        if opt in words:
            if directory is None:
                directory = workdir / "elsewhere"
                directory.mkdir(exist_ok=True)
            words[words.index(opt) + 1] = str(directory)
            break
    else:
        words = ["--directory", str(workdir), *words]
    cmd = [str(BIN / "snakemake"), *(["-n"] if dry else []), *words]
    return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)


def parse_plan(out: str) -> tuple[dict[str, int], set[str]]:
    """({rule: jobs} from the dry run's Job stats table, every planned output path)."""
    counts, outputs = {}, set()
    if "Job stats:" in out:
        table = out.split("Job stats:", 1)[1]
        for line in table.splitlines()[3:]:
            m = re.match(r"^(\S+)\s+(\d+)$", line.strip())
            if not m:
                break
            counts[m.group(1)] = int(m.group(2))
    for m in re.finditer(r"^\s+output: (.+)$", out, re.M):
        outputs.update(p.strip() for p in m.group(1).split(", "))
    return counts, outputs


@functools.lru_cache(maxsize=None)
def _dry_run(words: tuple[str, ...], workdir: Path):
    r = _snakemake(words, workdir)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"dry run of snakemake {shlex.join(words)} failed:\n{out[-3000:]}"
    return parse_plan(out)


def _normalized(words: list[str]) -> tuple[str, ...]:
    """The words without --cores N (the plan does not depend on it): one dry run each."""
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
        elif w in ("--cores", "-c", "--jobs", "-j"):
            skip = True
        else:
            out.append(w)
    return tuple(out)


PARSER = get_argument_parser()


def check_snakemake(words: list[str], workdir: Path, what: str) -> None:
    words = [w for w in words if w != "..."]  # "..." in a document: the rest of your options
    args = PARSER.parse_args(words)
    meant = [
        w for i, w in enumerate(words) if _MEANT_TARGET.match(w) and (i == 0 or words[i - 1] not in _NO_TARGET_OPTIONS)
    ]
    targets = set(args.targets or ())
    for t in meant:
        if t not in targets:
            where = (
                "-R/--forcerun" if t in (args.forcerun or ())
                else "--configfile" if t in map(str, args.configfile or ())
                else "--config" if t in (args.config or ())
                else "an option"
            )  # fmt: skip
            pytest.fail(
                f"{what}: {t} is meant as a target but Snakemake reads it as part of {where}, which "
                "takes every following word: put the target before the option, or after `--`"
            )
    if args.lint:
        pytest.fail(f"{what}: --lint is not checked here; list the command in SKIP")
    if any(opt in words for opt in _RUN_FOR_REAL):
        r = _snakemake(words, workdir, dry=False)
        assert r.returncode == 0, f"{what} failed:\n{(r.stdout + r.stderr)[-3000:]}"
        return
    if args.report:
        assert str(args.report).endswith((".html", ".zip")), f"{what}: --report takes {args.report!r}"
        i = words.index("--report")
        words = words[:i] + words[i + 2 :]
    counts, outputs = _dry_run(_normalized(words), workdir)
    assert counts, f"{what}: the dry run planned nothing"
    if meant:
        for t in meant:
            assert t in outputs, f"{what}: the plan does not make {t}"
        assert "all" not in counts, f"{what}: the plan builds the default target `all` ({counts.get('total')} jobs)"
    else:
        assert "all" in counts, f"{what}: no target named, yet the default target `all` is not planned"
        papers = next((c.split("=", 1)[1] for c in args.config or () if c.startswith("papers=")), None)
        if papers is not None:
            wanted = set(papers.strip("[]").replace(" ", "").split(","))
            for rule in counts:
                paper = rule.split("_")[0]
                assert paper not in {"heroes", "coax", "gim"} or paper in wanted, (
                    f"{what}: papers={papers} but the plan runs {rule}"
                )
    for rule in set(args.forcerun or ()) - set(meant):
        assert rule in counts, f"{what}: -R {rule} but {rule} is not in the plan ({sorted(counts)})"


@functools.lru_cache(maxsize=None)
def _default_outputs(workdir: Path) -> frozenset[str]:
    return frozenset(_dry_run((), workdir)[1])


def check_make(env: dict, words: list[str], workdir: Path, what: str) -> None:
    r = subprocess.run(["make", "-n", *words], cwd=ROOT, env={**_env(), **env}, capture_output=True, text=True)
    assert r.returncode == 0, f"{what}: make -n failed:\n{(r.stdout + r.stderr)[-3000:]}"
    variables = dict(w.split("=", 1) for w in words if re.match(r"^[A-Za-z_]\w*=", w))
    for value in variables.values():
        if value.startswith("results/"):
            made = _default_outputs(workdir)
            assert any(fnmatch.fnmatch(p, value) or p.startswith(value.rstrip("/") + "/") for p in made), (
                f"{what}: the default run writes nothing at {value}"
            )
    extra = shlex.split(variables.get("SNAKEMAKE_ARGS", ""))
    # recipe lines that run snakemake (after any VAR=value): not an echo that names it
    recipe = r.stdout.replace("\\\n", " ")
    lines = [line for line in recipe.splitlines() if re.match(r"^\s*(?:[A-Za-z_]\w*=\S*\s+)*\S*snakemake\s", line)]
    for line in lines:
        _, _, sm_words = _split(line.strip())
        if extra:
            n = len(extra)
            assert any(sm_words[i : i + n] == extra for i in range(len(sm_words) - n + 1)), (
                f"{what}: the recipe line `{line.strip()}` does not pass SNAKEMAKE_ARGS"
            )
        if "--lint" not in sm_words:
            check_snakemake(sm_words, workdir, f"{what} (recipe line `{line.strip()}`)")


def check_python_m(words: list[str], what: str) -> None:
    module, opts = words[0], [w.split("=")[0] for w in words[1:] if w.startswith("--") and w != "--"]
    r = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, f"{what}: python -m {module} --help failed:\n{r.stderr[-2000:]}"
    for o in opts:
        assert re.search(rf"{re.escape(o)}\b", r.stdout), f"{what}: python -m {module} has no option {o}"


def test_the_documents_have_commands():
    cmds = {c for _, c in COMMANDS}
    assert len(COMMANDS) >= 30, COMMANDS
    assert any(c.startswith("snakemake") and " -R " in c for c in cmds), "no rerun-one-figure command found"
    assert any(c.startswith("make report") for c in cmds)


def test_every_skip_is_a_command_of_the_documents():
    cmds = {c for _, c in COMMANDS}
    stale = set(SKIP) - cmds
    assert not stale, f"SKIP lists commands no document has any more: {stale}"


def starts_snakemake(cmd: str) -> bool:
    """Whether checking a command starts Snakemake (then its test is slow, out of the quick
    tier): a snakemake command (a dry run, or --unlock/--summary for real), `python -m
    snakemake` (its --help), or a make
    command whose recipe runs snakemake or that names a results/ path (checked against
    the default run's dry run). `make -n` says which, in milliseconds."""
    env, prog, words = _split(cmd)
    if cmd in SKIP:
        return False
    if prog == "python -m":
        return words[:1] == ["snakemake"]  # its --help is Snakemake starting
    if prog == "snakemake":
        return True
    if any(re.match(r"^[A-Za-z_]\w*=results/", w) for w in words):
        return True
    r = subprocess.run(["make", "-n", *words], cwd=ROOT, env={**_env(), **env}, capture_output=True, text=True)
    recipe = r.stdout.replace("\\\n", " ").splitlines()
    return any(re.match(r"^\s*(?:[A-Za-z_]\w*=\S*\s+)*\S*snakemake\s", line) for line in recipe)


@pytest.mark.parametrize(
    "where, cmd",
    [pytest.param(w, c, marks=[pytest.mark.slow] if starts_snakemake(c) else []) for w, c in COMMANDS],
    ids=[f"{w} {c[:60]}" for w, c in COMMANDS],
)
def test_documented_command_plans_what_its_text_says(where, cmd, workdir):
    if cmd in SKIP:
        pytest.skip(SKIP[cmd])
    what = f"{where}: `{cmd}`"
    env, prog, words = _split(cmd)
    if prog == "snakemake":
        check_snakemake(words, workdir, what)
    elif prog == "make":
        check_make(env, words, workdir, what)
    else:
        check_python_m(words, what)


@pytest.mark.slow  # dry runs
def test_a_target_after_R_is_caught(workdir):
    """The check itself: `-R rule target` (the target read as a second rule) fails."""
    words = ["--cores", "1", "-R", "gim_faithfulness_figure", "results/gim/figures/faithfulness.png"]
    with pytest.raises(pytest.fail.Exception, match="meant as a target but Snakemake reads it as part of -R"):
        check_snakemake(words, workdir, "example")
    check_snakemake([*words[:2], *words[4:], *words[2:4]], workdir, "example")  # target first: fine


def test_make_report_and_reproduce_pass_the_runs_options():
    args = "--configfile config/config.yaml config/test.yaml --config 'papers=[gim]' --directory run1"
    for target in ("report", "reproduce"):
        r = subprocess.run(
            ["make", "-n", target, f"SNAKEMAKE_ARGS={args}"], cwd=ROOT, env=_env(), capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        report = [line for line in r.stdout.splitlines() if "--report" in line]
        assert len(report) == 1 and report[0].rstrip().endswith(args), r.stdout


@pytest.mark.slow  # runs snakemake --report
def test_report_follows_the_runs_config(workdir):
    """`--report` builds the plan of its own options: in a folder of a run that made only
    paper C's files, given that run's options, the first file it misses is one of paper
    C's (or the ground truth's), not paper A's figure a bare `--report` asks for."""
    tiny = ["--configfile", "config/config.yaml", "config/test.yaml", "--config", "papers=[gim]"]
    r = _snakemake(["--report", "results/report.html", *tiny], workdir, dry=False)
    out = r.stdout + r.stderr
    m = re.search(r"File (\S+) marked for report but does not exist", out)
    assert r.returncode != 0 and m, out[-3000:]
    assert not m.group(1).startswith(("results/heroes", "results/coax")), m.group(1)


def _parsed(words) -> dict:
    """Snakemake's reading of a command's options, comparable (settings objects by value)."""
    return {k: vars(v) if hasattr(v, "__dict__") else v for k, v in vars(PARSER.parse_args(words)).items()}


@pytest.mark.slow
def test_documented_tiny_report_command_writes_the_report(gim_tiny_run, tmp_path):
    """The README's report command for a tiny run in its own folder, for real: the tiny
    paper-C run made with the README's own run options (the session's shared run,
    gim_tiny_run: the committed checkpoints, so nothing trains; made once for this test and
    tests/test_gim_workflow.py), then the command, on a copy of that run (it writes)."""
    readme = [c for w, c in COMMANDS if w.startswith("README.md") and "--report" in c and "--directory" in c]
    assert readme, "README.md shows no report command for a run in another folder"
    env, prog, words = _split(readme[0])
    report = words[words.index("--report") + 1]
    run = [w for i, w in enumerate(words) if "--report" not in words[i : i + 2]]  # the run's own options
    shared = list(golden_suite.gim_tiny_args("/tmp/tiny"))
    ours = list(_normalized(run))
    ours[ours.index("--directory") + 1] = "/tmp/tiny"
    assert _parsed(ours) == _parsed(shared), (
        f"the README's tiny run ({' '.join(run)}) is not the shared run the tests make "
        f"({' '.join(shared)}): update golden_suite.GIM_TINY_RUN"
    )
    d = tmp_path / "run"
    shutil.copytree(gim_tiny_run, d, symlinks=True)
    r = _snakemake(words, tmp_path, dry=False, directory=d)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert (d / report).stat().st_size > 10_000
    assert not (gim_tiny_run / report).exists()


def test_readme_stays_short():
    size = (ROOT / "README.md").stat().st_size
    assert size <= 12_288, f"README.md is {size} bytes: move detail into docs/ (limit 12,288)"


def test_no_bare_issue_numbers():
    """'issue 9' means nothing to a reader: say what it refers to."""
    for doc in DOCS:
        hits = re.findall(r".{0,30}\bissues?[- ]#?\d+.{0,30}", doc.read_text(), re.I)
        assert not hits, f"{doc.relative_to(ROOT)}: {hits}"


def _anchors(doc: Path) -> set[str]:
    """GitHub's anchors of a markdown file's headings (outside fenced code)."""
    out, fenced = set(), False
    for line in doc.read_text().splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6}\s+(.*?)\s*$", line)):
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-"))
    return out


def test_links_between_the_documents_resolve():
    """Every relative link of README.md and docs/**/*.md names a file that exists and, with
    #anchor, a heading of it (text moves between these documents)."""
    bad = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"^[a-z]+:", target):
                continue  # http(s), mailto
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                bad.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not bad, bad
