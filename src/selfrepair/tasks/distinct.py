"""How many distinct examples each of paper C's counterfactual toy tasks can draw, without
importing torch: the workflow checks its sample sizes (gim.n_eval and others) against
them at parse time (workflow/rules/gim.smk). Each count follows from its generator's
choices; tests/test_task_registry.py checks it against the task module and its samples.
"""

from __future__ import annotations

# task -> distinct clean prompts its ``sample(n, seed)`` draws from
PROMPTS = {
    "arithmetic": 20 * 20,  # operands a, b in 0..19 (tasks.arithmetic.N)
    "mcqa": 8 * 7 * 6 * 3,  # 3 of the 8 colours in order, and which of them is asked
    "ioi": 4 * 16 * 15 * 8 * 8 * 2,  # template, (IO, S) names, place, object, ABBA or BABA
}


def too_many(key: str, n: int, task: str) -> str | None:
    """The problem of drawing ``n`` examples (config ``key``) from ``task``, or None: more
    than its distinct prompts would score repeats of them as if they were new pairs."""
    have = PROMPTS.get(task)
    if have is None or n <= have:
        return None
    return (
        f"{key}: {n} exceeds the {have} distinct prompts of task {task} (more would only repeat them); at most {have}"
    )
