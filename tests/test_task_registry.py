"""tasks.registry: every counterfactual task by its name, and a clear error otherwise."""

import pytest

from selfrepair.tasks import arithmetic, classify, counterfactual, mcqa
from selfrepair.tasks.registry import get_task


@pytest.mark.parametrize(
    "name, cls",
    [
        ("mcqa", mcqa.MCQA),
        ("arithmetic", arithmetic.Arithmetic),
        ("ioi", counterfactual.ToyIOI),
        ("classify", classify.Classify),
    ],
)
def test_each_name_gives_its_task(name, cls):
    task = get_task(name)
    assert type(task) is cls and task.name == name


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown task 'sorting'; one of mcqa, arithmetic, ioi, classify"):
        get_task("sorting")


def test_distinct_prompt_counts_follow_the_generators():
    """tasks.distinct (torch-free, read at parse time) against the task modules: each count
    from the generator's choices, and a large sample of the small tasks draws every prompt."""
    from selfrepair.tasks import distinct, ioi

    assert distinct.PROMPTS["arithmetic"] == arithmetic.N**2
    c, names = len(mcqa.COLOURS), len(ioi.NAMES)
    assert distinct.PROMPTS["mcqa"] == c * (c - 1) * (c - 2) * mcqa.N_CHOICES
    assert distinct.PROMPTS["ioi"] == len(ioi.TEMPLATES) * names * (names - 1) * len(ioi.PLACES) * len(ioi.OBJECTS) * 2
    for name, n in (("arithmetic", 20_000), ("mcqa", 30_000)):
        clean = get_task(name).sample(n, seed=0).clean
        assert len({tuple(row) for row in clean.tolist()}) == distinct.PROMPTS[name], name


def test_too_many_examples_name_the_key_task_and_count():
    from selfrepair.tasks import distinct

    assert distinct.too_many("gim.n_eval", 400, "arithmetic") is None
    assert distinct.too_many("gim.n_eval", 401, "arithmetic") == (
        "gim.n_eval: 401 exceeds the 400 distinct prompts of task arithmetic (more would only repeat them); at most 400"
    )
