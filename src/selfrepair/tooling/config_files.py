"""The config files a run names, checked before Snakemake reads them (``make check-config``).

Snakemake reads the files given by ``--configfile`` itself, before the Snakefile runs: a
missing one ends in a ``FileNotFoundError`` traceback and one that is not valid YAML in
"Config file is not valid JSON or YAML", which names neither the file nor the line. This
module names both: the file, and for a YAML error its line and column. The Snakefile uses
it for ``config/config.yaml``; the schema checks come after, in the Snakefile's parse.

``python -m selfrepair.tooling.config_files [snakemake options]`` takes a run's options
in the form ``SNAKEMAKE_ARGS`` has them (``--configfile a.yaml b.yaml``; other options
are ignored) and exits 1 naming each bad file.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import yaml

DEFAULT = Path("config/config.yaml")  # the Snakefile's configfile


def yaml_problem(path: Path) -> str | None:
    """None if ``path`` is a file of valid YAML, else what is wrong with it, naming the
    file (and the line and column of a syntax error)."""
    path = Path(path)
    if not path.is_file():
        return f"{path}: no such config file" + (" (a directory)" if path.is_dir() else "")
    try:
        node = yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)  # syntax only
    except UnicodeDecodeError as e:
        return f"{path.resolve()}: not a text file ({e.reason} at byte {e.start})"
    except yaml.MarkedYAMLError as e:
        m, c = e.problem_mark, e.context_mark
        return f"{path.resolve()}: not valid YAML at line {m.line + 1}, column {m.column + 1}: {e.problem}" + (
            f" ({e.context} at line {c.line + 1})" if e.context and c else ""
        )
    except yaml.YAMLError as e:
        return f"{path.resolve()}: not valid YAML: {e}"
    if node is None:  # Snakemake: "Config file must be given as JSON or YAML", naming no file
        return (
            f"{path.resolve()}: the config file is empty (no keys, or comments only): give it the keys to set "
            "(e.g. device: cpu), or leave it off the command line"
        )
    if not isinstance(node, yaml.MappingNode):
        kind = "a list" if isinstance(node, yaml.SequenceNode) else f"the single value {node.value!r}"
        return f"{path.resolve()}: holds {kind}, not keys at its top level (key: value lines, e.g. device: cpu)"
    return None


def named_files(args: list[str]) -> list[Path]:
    """The config files a Snakemake command line reads: ``config/config.yaml`` (the
    Snakefile's) and every ``--configfile`` / ``--configfiles`` value. Snakemake reads
    them before it changes to ``--directory``, so relative paths are the caller's."""
    files, k = [], 0
    while k < len(args):
        a = args[k]
        if a in ("--configfile", "--configfiles"):
            k += 1
            while k < len(args) and not args[k].startswith("-"):
                files.append(args[k])
                k += 1
            continue
        if a.startswith(("--configfile=", "--configfiles=")):
            files.append(a.split("=", 1)[1])
        k += 1
    return [DEFAULT, *map(Path, files)]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 1 and " " in args[0]:  # SNAKEMAKE_ARGS passed as one word
        args = shlex.split(args[0])
    files = named_files(args)
    problems = [p for p in map(yaml_problem, files) if p]
    for p in problems:
        print(f"invalid config: {p}", file=sys.stderr)
    if not problems:
        print(f"config files readable: {', '.join(map(str, files))}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
