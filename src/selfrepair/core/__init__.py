"""The shared core every paper uses: models, training, components and interventions,
attribution, statistics and analysis, published claims, plots, runtime and numerics.

Imports nothing from the paper packages. Kept free of imports so that torch-free
modules (``numerics``) stay importable without torch.
"""
