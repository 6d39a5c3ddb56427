# The papers' analyses on models and datasets of one's own: config section `own:`
# (workflow/schemas/own.schema.yaml; docs/OWN_MODEL.md). Empty by default: no job.
# per entry and analysis: results/own/{name}/{kind}/status.csv and its tables
#   edges:   localization.csv, curves.csv, edges.csv, circuits/{method}.json (MIB format)
#   shapley: shapley.csv, interactions.csv, scores.csv, agreement.csv
#   coax:    scores.csv;  g_vs_c: g_vs_c.csv
# -> results/own/{name}/figures/faithfulness.png (edges)
# -> results/own/status.csv: one row per analysis, what ran (model identity, dataset hash)
#    or "not run" and why


import re as _re

from selfrepair.own import entries as _own  # noqa: E402  imports no torch

OWN = config.setdefault("own", [])
_own.fill_defaults(OWN, check_config(OWN, "own.schema.yaml", "own"))
_problems = _own.problems(OWN) + _own.lost_models(OWN)
if _problems:
    raise WorkflowError("invalid config:\n" + "\n".join(f"  {p}" for p in _problems))
OWN_BY_NAME = {e["name"]: e for e in OWN}
OWN_DIR = "results/own"
OWN_CODE = code_hash(
    "own/run",
    "own/analyses",
    "own/data",
    "own/entries",
    "tasks/mib",
    "core/models",
    *G_CODE,
    "groundtruth/pipeline",
    "groundtruth/players",
    "groundtruth/methods",
    "groundtruth/games",
    "groundtruth/shapley",
    "groundtruth/tables",
    "groundtruth/agreement",
    "coax/score",
    "coax/baselines",
    "heroes/scores",
    "heroes/__init__",  # gradient_importance
    "heroes/spread",
    "coax/__init__",  # coax_scores
    "gim/__init__",  # edge_table, write_circuit
)
OWN_CAPTIONS = {
    "edges": "localization",
    "shapley": "agreement",
    "coax": "scores",
    "g_vs_c": "g_vs_c",
}


wildcard_constraints:
    name="|".join(_re.escape(n) for n in OWN_BY_NAME) or "(?!)",


for _kind in _own.KINDS:

    rule:
        name:
            f"own_{_kind}"
        input:
            # a .gguf model: the folder rule lm_convert converts it into
            models=lambda w: gguf_inputs(
                [OWN_BY_NAME[w.name]["model"]], OWN_BY_NAME[w.name]["search_paths"]
            ),
        output:
            **own_outputs(_kind),
        log:
            f"logs/own/{{name}}/{_kind}.log",
        benchmark:
            f"benchmarks/own/{{name}}/{_kind}.tsv"
        conda:
            "../../envs/selfrepair.yaml"
        threads: COMPUTE_THREADS
        resources:
            gpu=GPU_JOB,
        params:
            kind=_kind,
            settings=lambda w, k=_kind: own_settings(w.name, k),
            # what of the model and dataset is on this machine: the job reruns when they arrive or change
            local=lambda w: _local_files.presence(
                [OWN_BY_NAME[w.name]["model"]],
                search_paths=OWN_BY_NAME[w.name]["search_paths"],
            )
            + "\n"
            + _own.presence(OWN_BY_NAME[w.name]["task"]),
            device=DEVICE,
            numerics=NUMERICS,
            code=OWN_CODE,
        script:
            "../../scripts/own_analysis.py"


rule own_status:
    input:
        status=own_status_files,  # a function: an empty section is said when the table is asked for
        # the figures too, so that the one target results/own/status.csv makes everything
        figures=[
            f"{OWN_DIR}/{e['name']}/figures/faithfulness.png"
            for e in OWN
            if "edges" in e["analyses"]
        ],
    output:
        report(
            f"{OWN_DIR}/status.csv",
            caption="../report/own_status.rst",
            category="Own models",
        ),
    log:
        "logs/own/status.log",
    localrule: True
    conda:
        "../../envs/selfrepair.yaml"
    script:
        "../../scripts/own_status.py"


if OWN:
    register("own", [f"{OWN_DIR}/status.csv"])


rule own_faithfulness_figure:
    input:
        curves=f"{OWN_DIR}/{{name}}/edges/curves.csv",
        status=f"{OWN_DIR}/{{name}}/edges/status.csv",
    output:
        report(
            f"{OWN_DIR}/{{name}}/figures/faithfulness.png",
            caption="../report/own_faithfulness.rst",
            category="Own models",
            subcategory="{name}",
        ),
    log:
        "logs/own/{name}/faithfulness_figure.log",
    localrule: True
    conda:
        "../../envs/selfrepair.yaml"
    params:
        code=code_hash("own/plots"),
    script:
        "../../scripts/own_figure.py"
