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
