# selfrepair: one DAG for three papers. Thin: config, validation, includes, rule all.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/heroes.smk"
include: "workflow/rules/heroes_grid.smk"
include: "workflow/rules/coax.smk"
include: "workflow/rules/gim.smk"
include: "workflow/rules/groundtruth.smk"
include: "workflow/rules/published.smk"


rule all:
    default_target: True
    input:
        all_targets(),
