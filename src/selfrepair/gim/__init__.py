"""Paper C (GIM): the backward modifications, the edge graph, MIB files and
faithfulness, feature attribution, attention self-repair, and the training runner of
the counterfactual tasks. Beside workflow/rules/gim.smk.
"""
