# selfrepair: one DAG for three papers. Thin: config, validation, includes, rule all.
from pathlib import Path

import yaml
from snakemake.utils import min_version

min_version("9.0")


# A YAML error in config/config.yaml (read from the working directory) is named with its
# line and column here; Snakemake's own message names neither, nor the file. Files given
# by --configfile are read by Snakemake itself, before this file runs.
_default_config = Path("config/config.yaml")
if _default_config.is_file():
    try:
        yaml.compose(_default_config.read_text(), Loader=yaml.SafeLoader)  # syntax only
    except yaml.MarkedYAMLError as e:
        m, c = e.problem_mark, e.context_mark
        raise WorkflowError(
            f"invalid config:\n  {_default_config.resolve()}: not valid YAML at line {m.line + 1}, "
            f"column {m.column + 1}: {e.problem}"
            + (f" ({e.context} at line {c.line + 1})" if e.context and c else "")
        )


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
