"""Data generators, each deterministic from a seed. Imports nothing from the paper
packages; the experiments and training runners on these data live in the papers'
packages."""
