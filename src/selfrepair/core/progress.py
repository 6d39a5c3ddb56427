"""A heartbeat for long parts of a job: what is running, how far it is, when it may end.

A real-model part (GPT-2 medium's COAX scan, one MIB method on Llama) runs for minutes
between two log lines of its own. ``Progress`` logs, every ``every`` seconds from a
background thread, one line: the model, the experiment, the stage (``data seed 2/3``),
the forward passes done and the rows (sequences) they ran (counted by a hook on the
model's unembedding, so every pass that reaches the logits counts, whichever code path
runs it; one pass of a COAX scan runs thousands of ablated rows), how many rows remain
and an ETA.

Remaining rows come from the stages already finished: the stages of one part do the
same kind of work (one prompt set each, one method each), so the mean rows per finished
stage times the stages left is the estimate. During the first stage there is none yet,
and the line says so instead of inventing one.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager


def _seconds(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _rows(out) -> int:
    t = out if hasattr(out, "shape") else getattr(out, "logits", None)
    if t is None and isinstance(out, (tuple, list)) and out:
        t = out[0]
    return int(t.shape[0]) if getattr(t, "ndim", 0) >= 1 else 1


class Progress:
    """``with Progress(model, experiment, n_stages) as p:`` then ``p.watch(bridge)`` and
    ``with p.stage('data seed 1'):`` around each stage.

    ``line()`` is the heartbeat's text; ``clock`` and ``log`` are injectable for tests.
    """

    def __init__(self, model: str, experiment: str, n_stages: int, every: float = 30.0, log=None, clock=None):
        if n_stages < 1:
            raise ValueError(f"n_stages must be at least 1, got {n_stages}")
        if every <= 0:
            raise ValueError(f"every must be positive, got {every}")
        self.model, self.experiment, self.n_stages, self.every = model, experiment, int(n_stages), float(every)
        self.log = log or logging.getLogger("selfrepair.progress").info
        self.clock = clock or time.monotonic
        self.forwards = 0  # forward passes that reached the logits
        self.rows = 0  # the sequences those passes ran
        self.done: list[tuple[int, float]] = []  # (rows, seconds) of each finished stage
        self.current = ""
        self.planned: int | None = None  # rows the current stage will run, when known
        self._stage_start = (0, 0.0)
        self._t0 = self.clock()
        self._hooks: list = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- counting
    def count(self, rows: int = 1) -> None:
        """One forward pass of ``rows`` sequences."""
        self.forwards += 1
        self.rows += int(rows)

    def watch(self, model) -> None:
        """Count the forward passes of ``model``: a TransformerBridge (its ``unembed``) or a
        Hugging Face LM (its output embeddings)."""
        head = getattr(model, "unembed", None)
        if head is None and hasattr(model, "get_output_embeddings"):
            head = model.get_output_embeddings()
        if head is None:
            raise TypeError(f"cannot count forward passes of {type(model).__name__}: no unembedding module")
        self._hooks.append(head.register_forward_hook(lambda _m, _i, out: self.count(_rows(out))))

    @contextmanager
    def stage(self, name: str, rows: int | None = None):
        """One stage; ``rows``: the rows it will run when the caller knows them (a COAX
        scan: 2 + 2|U| passes over the prompts), which gives an ETA before any stage ends."""
        self.current, self.planned = name, rows
        self._stage_start = (self.rows, self.clock())
        self.log(f"{self.model} {self.experiment}: {name} started ({len(self.done) + 1}/{self.n_stages})")
        yield self
        f0, t0 = self._stage_start
        self.done.append((self.rows - f0, self.clock() - t0))
        self.log(
            f"{self.model} {self.experiment}: {name} done in {_seconds(self.done[-1][1])}, "
            f"{self.done[-1][0]} rows ({len(self.done)}/{self.n_stages} stages)"
        )

    # ---------------------------------------------------------------- reporting
    def line(self) -> str:
        now = self.clock()
        left = self.n_stages - len(self.done)
        head = (
            f"{self.model} {self.experiment}: stage {min(len(self.done) + 1, self.n_stages)}/{self.n_stages}"
            + (f" ({self.current})" if self.current else "")
            + f", {self.forwards} forward passes of {self.rows} rows done in {_seconds(now - self._t0)}"
        )
        in_stage, stage_s = self.rows - self._stage_start[0], now - self._stage_start[1]
        if self.planned and in_stage > 0:  # this stage from its own plan and pace
            remaining = max(0, int(self.planned) - in_stage)
            eta = remaining * stage_s / in_stage
            if left <= 1:
                later = ""
            elif not self.done:
                later = f"; {left - 1} later stages not yet estimated"
            else:  # later stages as long as the finished ones were, on average
                later_s = (left - 1) * sum(s for _, s in self.done) / len(self.done)
                later = f"; {left - 1} later stages about {_seconds(later_s)}"
            return head + f"; about {remaining} rows remaining in this stage, ETA {_seconds(eta)}{later}"
        if not self.done:
            return head + "; remaining: not known until the first stage ends"
        per_row = sum(s for _, s in self.done) / max(1, sum(f for f, _ in self.done))
        mean_rows = sum(f for f, _ in self.done) / len(self.done)
        mean_s = sum(s for _, s in self.done) / len(self.done)
        in_stage = self.rows - self._stage_start[0] if left else 0
        remaining = max(0, round(mean_rows * left) - in_stage)
        eta = remaining * per_row if per_row > 0 else max(0.0, mean_s * left - (now - self._stage_start[1]))
        return head + f"; about {remaining} rows remaining, ETA {_seconds(eta)}"

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            self.log(self.line())

    def __enter__(self):
        self._t0 = self.clock()
        self._thread = threading.Thread(target=self._beat, name="selfrepair-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        return False
