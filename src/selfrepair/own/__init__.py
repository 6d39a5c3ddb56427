"""The papers' analyses on a model and a dataset of one's own, through the workflow: the
glue behind the ``own:`` config section and workflow/rules/own.smk (docs/OWN_MODEL.md).

Stands above the papers and the ground truth, like groundtruth above the papers: it may
import core, tasks, heroes, coax, gim and groundtruth; nothing in the library but the
tooling imports it. :mod:`selfrepair.own.entries` (no torch) holds the config checks,
:mod:`selfrepair.own.data` reads a dataset file, :mod:`selfrepair.own.analyses` calls the
papers' functions, :mod:`selfrepair.own.run` runs one analysis and writes its files.
"""
