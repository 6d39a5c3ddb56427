"""One ground truth for every method: Shapley values and pairwise interactions
of components on a task metric, from ablation games through the workflow's intervention
layer; agreement of each method's scores with them; corrected toy-IOI backup labels.

Sits above the paper packages: it may import heroes, coax, gim, core and tasks, and
nothing in src/selfrepair imports it. Kept free of imports.
"""
