"""The counterfactual tasks by name: one place that knows them all, so that no task
module imports another that imports it back."""

from __future__ import annotations

from selfrepair.tasks.arithmetic import Arithmetic
from selfrepair.tasks.classify import Classify
from selfrepair.tasks.counterfactual import ToyIOI
from selfrepair.tasks.mcqa import MCQA

TASKS = {"mcqa": MCQA, "arithmetic": Arithmetic, "ioi": ToyIOI, "classify": Classify}


def get_task(name: str):
    """A counterfactual task by name: ``mcqa``, ``arithmetic``, ``ioi`` or ``classify``."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; one of {', '.join(TASKS)}")
    return TASKS[name]()
