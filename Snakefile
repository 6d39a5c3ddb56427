# selfrepair: one DAG for three papers. Thin: config, validation, includes, rule all.
import sys
from pathlib import Path

from snakemake.utils import min_version

sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from selfrepair.tooling.config_files import yaml_problem  # noqa: E402  imports no torch

min_version("9.0")


# A YAML error in config/config.yaml (read from the working directory) is named with its
# line and column here; Snakemake's own message names neither, nor the file. Files given
# by --configfile are read by Snakemake itself, before this file runs: `make check-config`
# names theirs (selfrepair.tooling.config_files).
_default_config = Path("config/config.yaml")
if _default_config.is_file() and (_problem := yaml_problem(_default_config)):
    raise WorkflowError(f"invalid config:\n  {_problem}")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/lms.smk"
include: "workflow/rules/heroes.smk"
include: "workflow/rules/heroes_grid.smk"
include: "workflow/rules/coax.smk"
include: "workflow/rules/gim.smk"
include: "workflow/rules/groundtruth.smk"
include: "workflow/rules/published.smk"
include: "workflow/rules/real_lms_figures.smk"
include: "workflow/rules/own.smk"


rule all:
    default_target: True
    input:
        all_targets(),
