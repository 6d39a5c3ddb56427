"""The heartbeat of long real-model parts (core.progress): its counts and its ETA, by hand."""

import threading

import pytest
import torch

from selfrepair.core.progress import Progress


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_line_counts_forwards_and_estimates_the_rest_from_finished_stages():
    clock, lines = Clock(), []
    p = Progress("gpt2-medium", "wakeup", 3, every=30, log=lines.append, clock=clock)
    p._t0 = clock()
    assert p.line() == (
        "gpt2-medium wakeup: stage 1/3, 0 forward passes of 0 rows done in 0m00s; remaining: not known until the "
        "first stage ends"
    )
    with p.stage("data seed 1"):
        p.count(6)
        p.count(4)
        clock.t += 5.0
    with p.stage("data seed 2"):
        p.count(4)
        clock.t += 2.0
        # 10 rows per stage, 2 stages left (this one included), 4 done in it: 16 remain at 0.5 s each
        assert p.line() == (
            "gpt2-medium wakeup: stage 2/3 (data seed 2), 3 forward passes of 14 rows done in 0m07s; "
            "about 16 rows remaining, ETA 0m08s"
        )
    assert lines[:2] == [
        "gpt2-medium wakeup: data seed 1 started (1/3)",
        "gpt2-medium wakeup: data seed 1 done in 0m05s, 10 rows (1/3 stages)",
    ]


def test_a_planned_stage_has_an_eta_before_any_stage_ends():
    clock = Clock()
    p = Progress("pythia-160m", "induction", 2, log=lambda s: None, clock=clock)
    p._t0 = clock()
    with p.stage("COAX scan", rows=100):
        p.count(25)
        clock.t += 10.0
        # 75 rows left at 25 rows per 10 s
        assert p.line().endswith("about 75 rows remaining in this stage, ETA 0m30s; 1 later stages not yet estimated")


def test_a_planned_stage_after_finished_ones_uses_its_own_plan_and_pace():
    """An EActP stage after EAP's: far more rows than the stages before it, so its ETA
    comes from its planned rows at its own pace; the stages after it at the finished
    stages' mean time."""
    clock = Clock()
    p = Progress("llama", "MIB ioi", 3, log=lambda s: None, clock=clock)
    p._t0 = clock()
    with p.stage("eap"):
        p.count(10)
        clock.t += 4.0
    with p.stage("eactp", rows=1000):
        p.count(100)
        clock.t += 20.0
        # 900 rows left at 100 rows per 20 s: 180 s; one later stage about 4 s
        assert p.line().endswith("about 900 rows remaining in this stage, ETA 3m00s; 1 later stages about 0m04s")


def test_watch_counts_every_pass_that_reaches_the_logits():
    from transformers import GPT2Config, GPT2LMHeadModel

    hf = GPT2LMHeadModel(GPT2Config(vocab_size=20, n_positions=8, n_embd=8, n_layer=1, n_head=2))
    with Progress("m", "x", 1, log=lambda s: None) as p:
        p.watch(hf)
        for _ in range(3):
            hf(torch.zeros(2, 4, dtype=torch.long))
    assert (p.forwards, p.rows) == (3, 6)
    hf(torch.zeros(2, 4, dtype=torch.long))  # the hook is gone once the part ends
    assert (p.forwards, p.rows) == (3, 6)
    with pytest.raises(TypeError, match="cannot count forward passes of Linear"):
        Progress("m", "x", 1).watch(torch.nn.Linear(2, 2))


def test_heartbeat_logs_while_the_part_runs():
    got = threading.Event()
    lines = []

    def log(s):
        lines.append(s)
        got.set()

    with Progress("gpt2", "ioi", 2, every=0.01, log=log):
        assert got.wait(10), "no heartbeat line within 10 s"
    assert lines[0].startswith("gpt2 ioi: stage 1/2, 0 forward passes of 0 rows done in ")


@pytest.mark.parametrize(
    "kw,msg", [({"n_stages": 0}, "n_stages must be at least 1"), ({"every": 0}, "every must be positive")]
)
def test_bad_arguments_are_refused(kw, msg):
    args = {"model": "m", "experiment": "x", "n_stages": 1, **kw}
    with pytest.raises(ValueError, match=msg):
        Progress(**args)
