"""Paper B (COAX): the score, its baselines, pruning, and the IOI, induction and
language-model experiments and training runners. Beside workflow/rules/coax.smk.
"""
