"""Nothing silent on the paths of the records and of a user's GGUF file: the tables a
folder output holds checked against its record before a reading job starts, a converted
GGUF folder guarded like a packaged one, any legal GGUF file name, finished results kept
when their .gguf goes away, and each unclear error made to name its file or key and the
way out.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------ words of the project ----
# A tracker's number says nothing to a reader of the code: the line says what it does.
PROCESS_WORDS = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def process_words(paths, root: Path = ROOT) -> list[str]:
    out = []
    for p in paths:
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if PROCESS_WORDS.search(line):
                out.append(f"{p.relative_to(root)}:{i}: {line.strip()}")
    return out


def _project_files() -> list[Path]:
    files = [ROOT / "Snakefile", ROOT / "Makefile", ROOT / "README.md"]
    for d in ("scripts", "src", "workflow", "config", "docs"):
        files += [
            f
            for f in sorted((ROOT / d).rglob("*"))
            if f.is_file() and f.suffix in (".py", ".smk", ".yaml", ".md", ".rst") and "__pycache__" not in f.parts
        ]
    return files


def test_no_tracker_numbers_in_code_or_docs():
    assert len(_project_files()) > 100  # the scripts, the library, the rules, the docs
    assert process_words(_project_files()) == []


def test_process_words_are_found(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("a = 1\nb = 2  # checked here (issue 50)\nc = 3  # see Issues #7\nd = 4  # issues of size\n")
    assert process_words([bad], tmp_path) == ["x.py:2: b = 2  # checked here (issue 50)", "x.py:3: c = 3  # see Issues #7"]
