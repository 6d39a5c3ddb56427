# The papers' analyses on models and datasets of one's own: config section `own:`
# (workflow/schemas/own.schema.yaml; docs/OWN_MODEL.md). Empty by default: no job.
# per entry and analysis: results/own/{name}/{kind}/status.csv and its tables
#   edges:   localization.csv, curves.csv, edges.csv, circuits/{method}.json (MIB format)
#   shapley: shapley.csv, interactions.csv, scores.csv, agreement.csv
#   coax:    scores.csv;  g_vs_c: g_vs_c.csv
# -> results/own/status.csv: one row per analysis, what ran (model identity, dataset hash)
#    or "not run" and why


import re as _re

from selfrepair.own import entries as _own  # noqa: E402  imports no torch

OWN = config.setdefault("own", [])
check_config(OWN, "own.schema.yaml", "own")
_own.fill_defaults(OWN, yaml.safe_load((SCHEMAS / "own.schema.yaml").read_text()))
_problems = _own.problems(OWN)
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
    "groundtruth/methods",
    "groundtruth/games",
    "groundtruth/shapley",
    "groundtruth/tables",
    "groundtruth/agreement",
    "coax/score",
    "coax/baselines",
    "heroes/scores",
)
OWN_CAPTIONS = {
    "edges": "localization",
    "shapley": "agreement",
    "coax": "scores",
    "g_vs_c": "g_vs_c",
}


def own_settings(name, kind):
    """An entry's settings for one analysis: its own keys, then the papers' sections'."""
    s = dict(OWN_BY_NAME[name])
    s.setdefault("methods", list(GIM["methods"]))
    s.setdefault("batch_size", 16 if kind == "g_vs_c" else 32)
    s.update(
        fractions=list(GIM["fractions"]),
        ig_steps=GIM["ig_steps"],
        weighting="example",  # every pair weighs alike, whatever the batches
        tie_orders=GIM["ifr_tie_orders"],
        eactp_max_edges=GIM["eactp_max_edges"],
        circuit_fraction=GIM["circuit_fraction"],
        settings=dict(GT_SETTINGS),
        top_k=GT["top_k"],
        single_frac=GT["hidden_single_frac"],
        top_r=COAX["top_r"],
        max_rows=COAX["max_rows"],
        role_threshold=config["heroes"]["roles"]["threshold"],
    )
    return s


def own_outputs(kind):
    out = {t: f"{OWN_DIR}/{{name}}/{kind}/{t}.csv" for t in _own.TABLES[kind]}
    shown = OWN_CAPTIONS[kind]
    out[shown] = report(
        out[shown],
        caption=f"../report/own_{kind}.rst",
        category="Own models",
        subcategory="{name}",
    )
    if kind == "edges":
        out["circuits"] = directory(f"{OWN_DIR}/{{name}}/edges/circuits")
    out["status"] = f"{OWN_DIR}/{{name}}/{kind}/status.csv"
    return out


def own_status_files():
    return [f"{OWN_DIR}/{e['name']}/{k}/status.csv" for e in OWN for k in e["analyses"]]


wildcard_constraints:
    name="|".join(_re.escape(n) for n in OWN_BY_NAME) or "(?!)",


for _kind in _own.KINDS:

    rule:
        name:
            f"own_{_kind}"
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
        own_status_files(),
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
