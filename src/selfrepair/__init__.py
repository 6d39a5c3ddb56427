"""selfrepair: a reproducible replication library for three interpretability papers.

Paper A (Hidden Heroes and Gradient Bloats), paper B (COAX), paper C (GIM).
Everything that computes lives here; Snakemake rules only wire files to these functions.
"""

__version__ = "0.1.0"
