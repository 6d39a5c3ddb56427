"""The library's layout: a shared core, one package per paper, data generators in tasks.

Dependencies point one way: scripts -> tooling (the workflow's and the documents'
tooling: run status, the documents' tables) -> groundtruth -> paper packages (heroes,
coax, gim) -> core and tasks; core holds only computation that the papers share. The
papers stand side by side: none imports another, what two share lives in core or tasks.
Each paper package keeps its published-claims logic (tables -> claim ids, through
core/published's Measured / Holds / NotRun) in its own ``claims`` module, apart from the
computation: a claims module reads the computation's tables, no computation imports it
(only the tooling does). groundtruth compares every paper's methods on one ground truth,
so it may import all of them but their claims; nothing in the library imports it. A static
scan of every ``import`` / ``from`` statement of src/selfrepair (at module level and
inside functions) checks the direction and that no two modules import each other, however
indirectly; every module is also imported. Sizes: no file under src/ over 450 lines, no
function over 80 lines in src/, scripts/, benchmarks/ or peers/. docs/ARCHITECTURE.md says
where things live; tests/test_docs.py keeps its paths and package list true.
"""

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PKG = SRC / "selfrepair"
PAPERS = ("heroes", "coax", "gim")
TOP = "groundtruth"  # above the papers: imports any layer, imported by none
TOOLS = "tooling"  # the workflow's and the documents' tooling (status, readme_table): above everything
OWN = "own"  # the own: config section's glue, above groundtruth: imports any layer, imported by the tooling only
LAYERS = ("core", "tasks") + PAPERS + (TOP, OWN, TOOLS)
# each paper's published-claims logic; only the tooling imports it, the computation never
CLAIMS_MODULES = {f"selfrepair.{p}.claims" for p in PAPERS}


def is_claims_module(module: str) -> bool:
    """A paper's ``claims`` module, or a further claims module of a paper package, named
    ``*_claims`` (paper A's protocol grid claims: ``heroes.grid_claims``)."""
    return module in CLAIMS_MODULES or (layer(module) in PAPERS and module.rpartition(".")[2].endswith("_claims"))


# The papers stand side by side: none imports another. What two papers share lives a floor
# below (paper B's attention-head dropout, which paper C's toy IOI task is trained with, is
# core.train.train_gpt2_head_dropout on tasks.ioi.toy_training).
# What tasks/ may use of core/: I/O only (the runtime; where a dataset lies on disk),
# nothing that computes
TASKS_FROM_CORE = {"selfrepair.core.runtime", "selfrepair.core.local_files"}


def modules() -> list[str]:
    out = []
    for f in sorted(PKG.rglob("*.py")):
        parts = f.relative_to(SRC).with_suffix("").parts
        out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def _file(module: str) -> Path:
    p = SRC.joinpath(*module.split("."))
    return p / "__init__.py" if p.is_dir() else p.with_suffix(".py")


def imports(module: str) -> set[str]:
    """The selfrepair modules (or packages) that ``module`` imports anywhere in its code."""
    tree = ast.parse(_file(module).read_text())
    package = module if _file(module).name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "selfrepair"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.split(".")[0] != "selfrepair":
                continue
            for a in node.names:  # `from selfrepair.coax import score` imports a module
                sub = f"{name}.{a.name}"
                out.add(sub if sub in ALL else name)
    return out


ALL = set(modules())


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_the_package_holds_only_the_layers():
    entries = {p.name for p in PKG.iterdir() if p.name != "__pycache__"}
    assert entries == {"__init__.py", *LAYERS}, "flat modules or stubs left at the top of selfrepair/"
    for name in LAYERS:
        assert (PKG / name / "__init__.py").is_file()


@pytest.mark.parametrize("module", sorted(ALL))
def test_every_module_imports(module):
    importlib.import_module(module)


def test_every_import_names_a_module():
    for m in sorted(ALL):
        for dep in imports(m):
            assert dep in ALL, f"{m} imports {dep}, which is no module of src/selfrepair"


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    """The imports of ``graph`` ({module: the selfrepair modules it imports}) against the
    layering, one line each: an import up a floor, tasks/ beyond its I/O, one paper
    package importing another, and computation importing a claims module (a paper's
    ``claims`` reads the computation's tables, never the reverse)."""
    bad = []
    for m in sorted(graph):
        here = layer(m)
        for dep in sorted(graph[m]):
            if is_claims_module(dep) and not is_claims_module(m) and here != TOOLS:
                bad.append(f"{m} -> {dep} (computation imports no claims module; the claims read its tables)")
            there = layer(dep)
            if here is None or there is None or here == there:
                continue
            if there == TOOLS:
                bad.append(f"{m} -> {dep} (nothing in the library imports the tooling)")
            elif here == TOOLS:
                continue
            elif there == OWN:
                bad.append(f"{m} -> {dep} (nothing in the library imports own)")
            elif here == OWN:
                continue
            elif there == TOP:
                bad.append(f"{m} -> {dep} (nothing in the library imports groundtruth)")
            elif here == TOP:
                continue
            elif here == "core":
                bad.append(f"{m} -> {dep} (the core imports no paper and no task)")
            elif here == "tasks" and not (there == "core" and dep in TASKS_FROM_CORE):
                bad.append(f"{m} -> {dep} (tasks/ holds data generators only)")
            elif here in PAPERS and there in PAPERS:
                bad.append(f"{m} -> {dep} (one paper package imports another; move what they share to core or tasks)")
    return bad


def test_dependencies_point_one_way():
    bad = layering_violations({m: imports(m) for m in ALL})
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_the_layering_check_sees_each_kind_of_violation():
    """The check above on hand-made import maps: each forbidden import is one line, the
    allowed ones none."""
    one = {
        "selfrepair.gim.training": {"selfrepair.coax.ioi_experiment"},  # a paper importing a paper
        "selfrepair.coax.real_models": {"selfrepair.coax.claims"},  # computation importing claims
        "selfrepair.core.train": {"selfrepair.tasks.ioi"},  # the core importing a task
        "selfrepair.tasks.ioi": {"selfrepair.core.models"},  # tasks/ beyond its I/O
        "selfrepair.heroes.scores": {"selfrepair.groundtruth.pipeline"},  # a paper importing groundtruth
        "selfrepair.groundtruth.pipeline": {"selfrepair.heroes.claims"},  # computation above the papers too
    }
    bad = layering_violations(one)
    assert [line.split(" (")[0] for line in bad] == [
        "selfrepair.coax.real_models -> selfrepair.coax.claims",
        "selfrepair.core.train -> selfrepair.tasks.ioi",
        "selfrepair.gim.training -> selfrepair.coax.ioi_experiment",
        "selfrepair.groundtruth.pipeline -> selfrepair.heroes.claims",
        "selfrepair.heroes.scores -> selfrepair.groundtruth.pipeline",
        "selfrepair.tasks.ioi -> selfrepair.core.models",
    ]
    assert "one paper package imports another" in bad[2] and "imports no claims module" in bad[0]
    assert "imports no claims module" in bad[3]
    allowed = {
        "selfrepair.gim.claims": {"selfrepair.gim.localization", "selfrepair.core.published"},  # claims read tables
        "selfrepair.gim.training": {"selfrepair.core.train", "selfrepair.tasks.ioi"},  # papers use core and tasks
        "selfrepair.tasks.ioi": {"selfrepair.core.runtime", "selfrepair.tasks.sequences"},
        "selfrepair.groundtruth.pipeline": {"selfrepair.coax.ioi_experiment", "selfrepair.gim.attribute"},
        "selfrepair.tooling.status": {"selfrepair.coax.claims"},
    }
    assert layering_violations(allowed) == []


def test_a_papers_further_claims_module_counts_as_claims():
    """A paper's ``*_claims`` module (heroes.grid_claims) is claims code: computation may
    not import it, the paper's claims module and the tooling may; and a paper importing
    another paper's claims module is both a claims import and a paper-to-paper one."""
    assert is_claims_module("selfrepair.heroes.grid_claims") and is_claims_module("selfrepair.gim.claims")
    assert not is_claims_module("selfrepair.heroes.grid_tables")
    assert not is_claims_module("selfrepair.core.published")  # the claim types, not a paper's claims
    bad = layering_violations(
        {
            "selfrepair.heroes.tables": {"selfrepair.heroes.grid_claims"},
            "selfrepair.coax.score": {"selfrepair.heroes.grid_claims"},
        }
    )
    assert [line.split(" (")[0] for line in bad] == [
        "selfrepair.coax.score -> selfrepair.heroes.grid_claims",
        "selfrepair.coax.score -> selfrepair.heroes.grid_claims",
        "selfrepair.heroes.tables -> selfrepair.heroes.grid_claims",
    ]
    assert "imports no claims module" in bad[0] and "one paper package imports another" in bad[1]
    allowed = {
        "selfrepair.heroes.claims": {"selfrepair.heroes.grid_claims"},
        "selfrepair.tooling.status": {"selfrepair.heroes.grid_claims"},
    }
    assert layering_violations(allowed) == []


def test_no_import_circle_between_packages():
    graph = {name: set() for name in LAYERS}
    for m in ALL:
        for dep in imports(m):
            if layer(m) and layer(dep) and layer(m) != layer(dep):
                graph[layer(m)].add(layer(dep))
    done, path = set(), []

    def visit(n):
        assert n not in path, f"import circle: {' -> '.join(path[path.index(n) :] + [n])}"
        if n in done:
            return
        path.append(n)
        for d in sorted(graph[n]):
            visit(d)
        path.pop()
        done.add(n)

    for n in LAYERS:
        visit(n)


def test_the_workflow_imports_stay_torch_free():
    """The Snakefile imports core.numerics, local_files, published (common.smk),
    heroes.grid (heroes_grid.smk) and tasks.distinct (gim.smk) to build the DAG: none may
    pull in torch."""
    code = (
        "import sys; from selfrepair.core import numerics, runtime, local_files, published; "
        "from selfrepair.heroes import grid; from selfrepair.tasks import distinct; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan), each sorted: the
    modules that import each other, directly or through others."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_import_circles_are_found():
    """The circle finder on hand-made graphs: a -> b -> c -> a is one circle, d alone none."""
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []
    assert import_circles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}) == [["a", "b"], ["c", "d"]]


def test_no_import_circle_between_modules():
    """No module imports one that imports it back, at module level or inside a function."""
    graph = {m: {d for d in imports(m) if d in ALL and d != m} for m in ALL}
    # a package's __init__ re-exporting its modules is not a circle of code
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
    assert import_circles(graph) == []


# The published claims' values and their status (core/published): only a paper's claims
# module makes them.
CLAIM_TYPES = {"Measured", "Holds", "NotRun", "status_of"}


def claim_code(source: str) -> list[str]:
    """What of a module's ``source`` is claims code: the claim types it imports from
    core.published (and ``status_of``, which decides a claim's status), and its functions
    named like a claims entry point (``measured_claims``, ... ``*_claims``,
    ``claims_evidence``, ``claims_table``: ``claims_*``)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "selfrepair.core.published":
            out += [f"imports {a.name}" for a in node.names if a.name in CLAIM_TYPES]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.col_offset == 0:
            if node.name.endswith("_claims") or node.name.startswith("claims_"):
                out.append(f"defines {node.name}()")
    return out


def test_claims_code_lives_in_each_papers_claims_module():
    """Every paper package has a ``claims`` module that maps its tables to claim ids; no
    other module of the library (core.published, where the claim types are defined, and
    the tooling aside) imports a claim type or defines a claims function."""
    for m in sorted(CLAIMS_MODULES):
        assert m in ALL, f"no module {_file(m).relative_to(ROOT)}"
        assert any(s.startswith("defines") for s in claim_code(_file(m).read_text())), m
    bad = [
        f"{m}: {s}"
        for m in sorted(ALL - {"selfrepair.core.published"})
        if layer(m) != TOOLS and not is_claims_module(m)
        for s in claim_code(_file(m).read_text())
    ]
    assert not bad, "claims code outside the papers' claims modules:\n" + "\n".join(bad)


def test_the_claims_check_sees_claims_code():
    """The check above flags a module that imports a claim type or defines a claims function."""
    src = "from selfrepair.core.published import Holds, status_of\n\ndef measured_claims():\n    pass\n"
    assert claim_code(src) == ["imports Holds", "imports status_of", "defines measured_claims()"]
    table = "from selfrepair.core.published import load_claims\n\ndef claims_table():\n    pass\n"
    assert claim_code(table) == ["defines claims_table()"]
    assert claim_code("def paired_table():\n    pass\n") == []


# ---------------------------------------------------------------- sizes ------------
# No room too big to hold in mind (issue 49): no file under src/ over MAX_FILE_LINES lines,
# no function (or method) over MAX_FUNCTION_LINES lines, from its ``def`` line to its last,
# in src/, scripts/, benchmarks/ or peers/ (not peers/work/: the peers' own clones).
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 80
FUNCTION_FOLDERS = ("src", "scripts", "benchmarks", "peers")
NOT_OURS = ROOT / "peers" / "work"


def long_functions(source: str, where: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``where:name (n lines)`` for every function or method of ``source`` longer than
    ``limit`` lines (``def`` line to last line, decorators not counted)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > limit:
                out.append(f"{where}:{node.name} ({n} lines)")
    return sorted(out)


def long_files(folder: Path, limit: int = MAX_FILE_LINES) -> list[str]:
    """``path (n lines)`` for every .py file under ``folder`` longer than ``limit`` lines."""
    out = []
    for f in sorted(folder.rglob("*.py")):
        n = len(f.read_text().splitlines())
        if n > limit:
            out.append(f"{f.relative_to(folder.parent).as_posix()} ({n} lines)")
    return out


def _repo_long_functions() -> list[str]:
    out = []
    for d in FUNCTION_FOLDERS:
        for f in sorted((ROOT / d).rglob("*.py")):
            if not f.is_relative_to(NOT_OURS):
                out += long_functions(f.read_text(), f.relative_to(ROOT).as_posix())
    return out


def test_no_file_under_src_is_over_450_lines():
    bad = long_files(SRC)
    assert not bad, (
        f"files under src/ over {MAX_FILE_LINES} lines: split each along its seams into modules "
        "(each starting with a docstring that says what it holds):\n" + "\n".join(bad)
    )


def test_no_function_is_over_80_lines():
    bad = _repo_long_functions()
    assert not bad, (
        f"functions over {MAX_FUNCTION_LINES} lines in {', '.join(FUNCTION_FOLDERS)}: cut each into "
        "helpers that compute one thing:\n" + "\n".join(bad)
    )


def test_the_size_checks_see_an_oversized_function_and_file(tmp_path):
    """The checkers above on made-up code: a function of 81 lines is named, one of 80 is
    not, a method counts as a function; a file of 451 lines is named, one of 450 is not."""

    def function(name, n_lines, indent=""):  # a def line, n_lines - 2 body lines, a return
        body = "".join(f"{indent}    x{i} = {i}\n" for i in range(n_lines - 2))
        return f"{indent}def {name}():\n{body}{indent}    return 0\n"

    source = function("ok", 80) + function("too_long", 81) + "class C:\n" + function("method", 95, "    ")
    assert long_functions(source, "m.py") == ["m.py:method (95 lines)", "m.py:too_long (81 lines)"]
    assert long_functions(function("ok", 80), "m.py") == []
    pkg = tmp_path / "src"
    (pkg / "p").mkdir(parents=True)
    (pkg / "p" / "big.py").write_text("x = 0\n" * 451)
    (pkg / "p" / "fits.py").write_text("x = 0\n" * 450)
    assert long_files(pkg) == ["src/p/big.py (451 lines)"]


# ---------------------------------------------------------------- docs/ARCHITECTURE.md -
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
_CODE_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_PACKAGE_ROW = re.compile(r"^\|\s*`src/selfrepair/(\w+)/`\s*\|")
_PATH_SUFFIXES = (".py", ".md", ".yaml", ".smk", ".csv", ".png", ".txt")


def architecture_problems(text: str, root: Path = ROOT) -> list[str]:
    """What docs/ARCHITECTURE.md's ``text`` gets wrong about the repository at ``root``:

    * a code span that names a path (it holds a ``/``, or is a ``.py`` file name, or is
      ``Snakefile``) that does not exist: tried from the root, then under src/selfrepair/
      (``coax/score.py``), and a bare ``x.py`` in a package's table row in that package;
      placeholders (``<name>``, ``{seed}``) are not paths. A ``results/`` path outside
      ``results/reference/`` is a workflow output: it must be a target of a ``snakemake``
      command of the page (tests/test_docs.py dry-runs that command, so the run plans it);
    * the packages of its table (rows starting ``| `src/selfrepair/<name>/` |``) against
      the packages of src/selfrepair/."""
    src = root / "src" / "selfrepair"
    bad = []
    commands = [m.group(1) for m in _CODE_SPAN.finditer(text) if m.group(1).startswith("snakemake ")]
    targets = {w for c in commands for w in c.split() if w.startswith("results/")}
    for line in text.splitlines():
        row = _PACKAGE_ROW.match(line)
        for span in _CODE_SPAN.findall(line):
            if " " in span or "<" in span or "{" in span or span.startswith("--"):
                continue
            if not ("/" in span or span.endswith(".py") or span == "Snakefile"):
                continue
            if row and span == f"src/selfrepair/{row.group(1)}/":
                continue  # a package of the table: checked against src/selfrepair/ below
            if span.startswith("results/") and not span.startswith("results/reference/"):
                if span.rstrip("/") not in targets:
                    bad.append(f"{span}: a workflow output that no snakemake command of the page names as a target")
                continue
            here = [root / span, src / span] + ([src / row.group(1) / span] if row and "/" not in span else [])
            if "/" not in span and span.endswith(".py") and not row:
                here += list(src.rglob(span))
            if not any(p.exists() for p in here):
                bad.append(f"{span}: no such path (from the repository root or src/selfrepair/)")
    listed = {m.group(1) for line in text.splitlines() if (m := _PACKAGE_ROW.match(line))}
    packages = {d.name for d in src.iterdir() if (d / "__init__.py").is_file()}
    for name in sorted(packages - listed):
        bad.append(
            f"package src/selfrepair/{name}/ is missing from the packages table of docs/ARCHITECTURE.md: "
            f"add a row | `src/selfrepair/{name}/` | <its floor> | <what it holds> | (and name it in the floors "
            "diagram if it adds a floor)"
        )
    for name in sorted(listed - packages):
        bad.append(f"docs/ARCHITECTURE.md lists src/selfrepair/{name}/, which is no package: remove its row")
    return bad


def test_the_architecture_page_names_only_what_exists():
    bad = architecture_problems(ARCHITECTURE.read_text())
    assert not bad, "docs/ARCHITECTURE.md:\n" + "\n".join(bad)


def test_the_architecture_check_sees_a_missing_path_and_package(tmp_path):
    """The check above on a made-up repository: a missing module, an output no command
    plans, a package missing from the table and a row for a package that is not there."""
    pkg = tmp_path / "src" / "selfrepair"
    for name in ("core", "own"):
        (pkg / name).mkdir(parents=True)
        (pkg / name / "__init__.py").write_text('"""x"""\n')
    (pkg / "core" / "models.py").write_text("")
    page = (
        "| `src/selfrepair/core/` | bottom | `models.py`, `gone.py` |\n"
        "| `src/selfrepair/old/` | papers | x |\n"
        "See `core/models.py` and `core/none.py`, `results/reference/x.csv`, `results/a/b.csv` "
        "and `results/c.csv`; `workflow/rules/<name>.smk` is a placeholder.\n"
        "`snakemake --cores 1 results/a/b.csv`\n"
    )
    assert architecture_problems(page, tmp_path) == [
        "gone.py: no such path (from the repository root or src/selfrepair/)",
        "core/none.py: no such path (from the repository root or src/selfrepair/)",
        "results/reference/x.csv: no such path (from the repository root or src/selfrepair/)",
        "results/c.csv: a workflow output that no snakemake command of the page names as a target",
        "package src/selfrepair/own/ is missing from the packages table of docs/ARCHITECTURE.md: add a row "
        "| `src/selfrepair/own/` | <its floor> | <what it holds> | (and name it in the floors diagram if it "
        "adds a floor)",
        "docs/ARCHITECTURE.md lists src/selfrepair/old/, which is no package: remove its row",
    ]
