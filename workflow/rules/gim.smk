# Paper C: GIM (gradient interaction modifications) and MIB-style circuit localization.
# toy tasks:  results/gim/{task}/{gmodel}/seed{gseed}/model -> localization.csv, curves.csv,
#             circuits/{method}.json (MIB format); one model per (task, gmodel, seed)
# tables:     results/gim/tables/localization.csv (per model), localization_summary.csv
#             (mean and t-CI over a task's models, paired GIM - EAP / EAP-IG), curves.csv; speed.csv
#             selfrepair_{occurrences,ablations}.csv -> tables/selfrepair.csv (first seed)
# attribution: results/gim/classify/{gmodel}/seed{first seed}/model -> feature_attribution.csv
#             -> tables/feature_attribution.csv
# MIB:        results/gim/mib/status.csv, localization.csv (models/datasets present locally)
# -> results/gim/figures/faithfulness.png, selfrepair.png, results/published/gim.csv


# The gim section is validated (defaults filled in) in common.smk.
from selfrepair.tasks import distinct as _distinct  # noqa: E402  imports no torch

GIM = config["gim"]
G_DIR = "results/gim"
G_MODELS = {
    m["name"]: {k: v for k, v in m.items() if k != "name"} for m in GIM["models"]
}
# Every (task, model) is trained once per seed (gim.seeds; absent: the one gim.seed).
# Self-repair, feature attribution and speed use the first seed's models only.
G_SEEDS = [int(s) for s in (GIM.get("seeds") or [GIM["seed"]])]
G_SEED0 = G_SEEDS[0]
# What the schema cannot say: the speed comparison's model and task are ones trained
# here, and no sample is larger than its task's distinct prompts (tasks.distinct).
_problems = []
if GIM["speed"]["model"] not in G_MODELS:
    _problems.append(
        f"gim.speed.model: {GIM['speed']['model']!r} is not a model of gim.models "
        f"(one of: {', '.join(G_MODELS)})"
    )
if GIM["speed"]["task"] not in GIM["tasks"]:
    _problems.append(
        f"gim.speed.task: {GIM['speed']['task']!r} is not one of gim.tasks "
        f"({', '.join(GIM['tasks'])}), whose models are the ones trained"
    )
for _key, _n, _tasks in (
    ("gim.n_eval", GIM["n_eval"], GIM["tasks"]),
    ("gim.selfrepair.n_inputs", GIM["selfrepair"]["n_inputs"], GIM["tasks"]),
    ("gim.speed.n_eval", GIM["speed"]["n_eval"], [GIM["speed"]["task"]]),
):
    for _gtask in _tasks:
        if _distinct.too_many(_key, _n, _gtask):
            _problems.append(_distinct.too_many(_key, _n, _gtask))
# MIB's batch weighting needs equal batches to weigh every example alike, as MIB's own
# settings have them (100 examples in batches of 20).
if GIM["weighting"] == "mib":
    for _n, _nv, _b, _bv in (
        ("gim.n_eval", GIM["n_eval"], "gim.batch_size", GIM["batch_size"]),
        (
            "gim.mib.n_eval",
            GIM["mib"]["n_eval"],
            "gim.mib.batch_size",
            GIM["mib"]["batch_size"],
        ),
    ):
        if _bv != "auto" and _nv % _bv:
            _problems.append(
                f"{_b} ({_bv}) does not divide {_n} ({_nv}): under gim.weighting mib (MIB's "
                "batch weighting) every batch must be full; choose a divisor, or set "
                "gim.weighting: example"
            )
if _problems:
    raise WorkflowError("invalid config:\n" + "\n".join(f"  {p}" for p in _problems))
G_M = f"{G_DIR}/{{gtask}}/{{gmodel}}/seed{{gseed}}"
G_CLAIMS = PUBLISHED
G_TRAIN_CODE = (
    "gim/training",
    "core/train",
    "core/models",
    "core/model_files",
    "tasks/counterfactual",
    "tasks/registry",
    "tasks/mcqa",
    "tasks/arithmetic",
    "tasks/classify",
    "tasks/ioi",
)
G_CODE_FA = (
    "gim/backward",
    "gim/feature_attribution",
    "tasks/classify",
    "tasks/counterfactual",
    "core/models",
    "core/model_files",
)
G_CODE = (
    "gim/backward",
    "gim/graph",
    "gim/hooks",
    "gim/evaluate",
    "gim/edge_patch",
    "gim/attribute",
    "gim/patching",
    "gim/flow_routes",
    "gim/mib_weights",
    "gim/localization",
    "tasks/counterfactual",
    "tasks/registry",
    "tasks/mcqa",
    "tasks/arithmetic",
)


wildcard_constraints:
    gtask="|".join(GIM["tasks"] + ["classify"]),
    gmodel="|".join(G_MODELS),
    gseed="[0-9]+",


register(
    "gim",
    [
        f"{G_DIR}/figures/faithfulness.png",
        f"{G_DIR}/tables/localization.csv",
        f"{G_DIR}/tables/localization_summary.csv",
        f"{G_DIR}/tables/speed.csv",
        f"{G_DIR}/figures/selfrepair.png",
        f"{G_DIR}/tables/selfrepair.csv",
        f"{G_DIR}/tables/feature_attribution.csv",
        f"{G_DIR}/mib/status.csv",
        "results/published/gim.csv",
    ],
)


rule gim_train:
    output:
        model=directory(f"{G_M}/model"),
    log:
        "logs/gim/seed{gseed}/train_{gtask}_{gmodel}.log",
    benchmark:
        "benchmarks/gim/seed{gseed}/train_{gtask}_{gmodel}.tsv"
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
    params:
        task="{gtask}",
        model=lambda w: G_MODELS[w.gmodel],
        seed=lambda w: int(w.gseed),
        train=GIM["train"],
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(*G_TRAIN_CODE),
    script:
        "../../scripts/gim_train.py"


rule gim_localize:
    input:
        model=f"{G_M}/model",
    output:
        summary=f"{G_M}/localization.csv",
        curves=f"{G_M}/curves.csv",
        circuits=directory(f"{G_M}/circuits"),
    log:
        "logs/gim/seed{gseed}/localize_{gtask}_{gmodel}.log",
    benchmark:
        "benchmarks/gim/seed{gseed}/localize_{gtask}_{gmodel}.tsv"
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
    params:
        task="{gtask}",
        model_name="{gmodel}",
        seed=lambda w: int(w.gseed),
        methods=GIM["methods"],
        eactp_max_edges=GIM["eactp_max_edges"],
        n_eval=GIM["n_eval"],
        data_seed=GIM["data_seed"],
        batch_size=GIM["batch_size"],
        weighting=GIM["weighting"],
        ig_steps=GIM["ig_steps"],
        fractions=GIM["fractions"],
        circuit_fraction=GIM["circuit_fraction"],
        tie_orders=GIM["ifr_tie_orders"],
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(*G_CODE, "core/models", "core/model_files"),
    script:
        "../../scripts/gim_localize.py"


rule gim_tables:
    input:
        summaries=expand(
            f"{G_M}/localization.csv",
            gtask=GIM["tasks"],
            gmodel=list(G_MODELS),
            gseed=G_SEEDS,
        ),
        curves=expand(
            f"{G_M}/curves.csv",
            gtask=GIM["tasks"],
            gmodel=list(G_MODELS),
            gseed=G_SEEDS,
        ),
    output:
        table=report(
            f"{G_DIR}/tables/localization.csv",
            caption="../report/gim_localization.rst",
            category="Paper C",
        ),
        summary=report(
            f"{G_DIR}/tables/localization_summary.csv",
            caption="../report/gim_localization_summary.rst",
            category="Paper C",
        ),
        curves=f"{G_DIR}/tables/curves.csv",
    log:
        "logs/gim/tables.log",
    conda:
        "../../envs/selfrepair.yaml"
    params:
        code=code_hash("gim/localization", "core/stats"),
    script:
        "../../scripts/gim_tables.py"


rule gim_faithfulness_figure:
    input:
        curves=f"{G_DIR}/tables/curves.csv",
    output:
        report(
            f"{G_DIR}/figures/faithfulness.png",
            caption="../report/gim_faithfulness.rst",
            category="Paper C",
        ),
    log:
        "logs/gim/faithfulness_figure.log",
    conda:
        "../../envs/selfrepair.yaml"
    script:
        "../../scripts/gim_plot_faithfulness.py"


rule gim_speed:
    input:
        model=f"{G_DIR}/{GIM['speed']['task']}/{GIM['speed']['model']}/seed{G_SEED0}/model",
    output:
        report(
            f"{G_DIR}/tables/speed.csv",
            caption="../report/gim_speed.rst",
            category="Paper C",
        ),
    log:
        "logs/gim/speed.log",
    benchmark:
        "benchmarks/gim/speed.tsv"
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
    params:
        task=GIM["speed"]["task"],
        model_name=GIM["speed"]["model"],
        n_eval=GIM["speed"]["n_eval"],
        data_seed=GIM["data_seed"],
        batch_size=GIM["batch_size"],
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(*G_CODE, "core/models", "core/model_files"),
    script:
        "../../scripts/gim_speed.py"


rule gim_published:
    input:
        claims=G_CLAIMS,
        localization=f"{G_DIR}/tables/localization.csv",
        summary=f"{G_DIR}/tables/localization_summary.csv",
        selfrepair=f"{G_DIR}/tables/selfrepair.csv",
        fa=f"{G_DIR}/tables/feature_attribution.csv",
        mib=f"{G_DIR}/mib/localization.csv",
    output:
        csv=report(
            "results/published/gim.csv",
            caption="../report/published.rst",
            category="Published vs reproduced",
        ),
    log:
        "logs/gim/published.log",
    conda:
        "../../envs/selfrepair.yaml"
    params:
        code=code_hash(
            "core/published",
            "gim/claims",
            "gim/graph",
            "gim/selfrepair_attention",
            "core/stats",
        ),
    script:
        "../../scripts/gim_published.py"


rule gim_selfrepair:
    input:
        model=f"{G_M}/model",
    output:
        occurrences=f"{G_M}/selfrepair_occurrences.csv",
        ablations=f"{G_M}/selfrepair_ablations.csv",
    log:
        "logs/gim/seed{gseed}/selfrepair_{gtask}_{gmodel}.log",
    benchmark:
        "benchmarks/gim/seed{gseed}/selfrepair_{gtask}_{gmodel}.tsv"
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
    params:
        task="{gtask}",
        model_name="{gmodel}",
        n_inputs=GIM["selfrepair"]["n_inputs"],
        threshold=GIM["selfrepair"]["threshold"],
        data_seed=GIM["data_seed"],
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(
            *G_CODE, "gim/selfrepair_attention", "core/models", "core/model_files"
        ),
    script:
        "../../scripts/gim_selfrepair.py"


rule gim_selfrepair_table:
    input:
        occurrences=expand(
            f"{G_M}/selfrepair_occurrences.csv",
            gtask=GIM["tasks"],
            gmodel=list(G_MODELS),
            gseed=G_SEED0,
        ),
        ablations=expand(
            f"{G_M}/selfrepair_ablations.csv",
            gtask=GIM["tasks"],
            gmodel=list(G_MODELS),
            gseed=G_SEED0,
        ),
    output:
        summary=report(
            f"{G_DIR}/tables/selfrepair.csv",
            caption="../report/gim_selfrepair_table.rst",
            category="Paper C",
        ),
        occurrences=f"{G_DIR}/tables/selfrepair_occurrences.csv",
        ablations=f"{G_DIR}/tables/selfrepair_ablations.csv",
    log:
        "logs/gim/selfrepair_table.log",
    conda:
        "../../envs/selfrepair.yaml"
    params:
        code=code_hash("gim/selfrepair_attention"),
    script:
        "../../scripts/gim_selfrepair_table.py"


rule gim_selfrepair_figure:
    input:
        occurrences=f"{G_DIR}/tables/selfrepair_occurrences.csv",
        ablations=f"{G_DIR}/tables/selfrepair_ablations.csv",
    output:
        report(
            f"{G_DIR}/figures/selfrepair.png",
            caption="../report/gim_selfrepair.rst",
            category="Paper C",
        ),
    log:
        "logs/gim/selfrepair_figure.log",
    conda:
        "../../envs/selfrepair.yaml"
    script:
        "../../scripts/gim_plot_selfrepair.py"


rule gim_fa:
    input:
        model=f"{G_DIR}/classify/{{gmodel}}/seed{{gseed}}/model",
    output:
        f"{G_DIR}/classify/{{gmodel}}/seed{{gseed}}/feature_attribution.csv",
    log:
        "logs/gim/seed{gseed}/fa_{gmodel}.log",
    benchmark:
        "benchmarks/gim/seed{gseed}/fa_{gmodel}.tsv"
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
    params:
        model_name="{gmodel}",
        n_examples=GIM["fa"]["n_examples"],
        ig_steps=GIM["fa"]["ig_steps"],
        methods=GIM["fa"]["methods"],
        data_seed=GIM["data_seed"],
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(*G_CODE_FA),
    script:
        "../../scripts/gim_fa.py"


rule gim_fa_table:
    input:
        expand(
            f"{G_DIR}/classify/{{gmodel}}/seed{{gseed}}/feature_attribution.csv",
            gmodel=list(G_MODELS),
            gseed=G_SEED0,
        ),
    output:
        report(
            f"{G_DIR}/tables/feature_attribution.csv",
            caption="../report/gim_feature_attribution.rst",
            category="Paper C",
        ),
    log:
        "logs/gim/fa_table.log",
    conda:
        "../../envs/selfrepair.yaml"
    params:
        code=code_hash("gim/feature_attribution"),
    script:
        "../../scripts/gim_fa_table.py"


rule gim_mib:
    input:
        # .gguf models: the folders rule lm_convert converts them into
        models=gguf_inputs(GIM["mib"]["models"]),
    output:
        status=f"{G_DIR}/mib/status.csv",
        table=f"{G_DIR}/mib/localization.csv",
        curves=f"{G_DIR}/mib/curves.csv",
    log:
        "logs/gim/mib.log",
    benchmark:
        "benchmarks/gim/mib.tsv"
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
    params:
        models=GIM["mib"]["models"],
        datasets=GIM["mib"]["datasets"],
        search_paths=GIM["mib"]["search_paths"],
        # what of MIB's models and datasets is on this machine: the job reruns when they arrive or change
        local=lambda w: _local_files.presence(
            GIM["mib"]["models"], GIM["mib"]["datasets"], GIM["mib"]["search_paths"]
        ),
        n_eval=GIM["mib"]["n_eval"],
        batch_size=GIM["mib"]["batch_size"],
        dtype=GIM["mib"]["dtype"],
        memory_gb=GIM["mib"]["memory_gb"],
        weighting=GIM["weighting"],
        kv_inputs=GIM["kv_inputs"],
        bos=GIM["bos"],
        methods=GIM["methods"],
        eactp_max_edges=GIM["eactp_max_edges"],
        ig_steps=GIM["ig_steps"],
        fractions=GIM["fractions"],
        tie_orders=GIM["ifr_tie_orders"],
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(
            *G_CODE,
            "tasks/mib",
            "core/models",
            "core/model_files",
            "gim/memory",
            "gim/precision",
        ),
    script:
        "../../scripts/gim_mib.py"


# ---- Real LMs (lms.models): MIB-format datasets made here, the accuracy gate, localization
# with bootstrap intervals over pairs, feature attribution on IOI (gim/lm_run.py).
G_LMS = GIM["lms"]
G_LM_DATA = "results/lms/data"
G_LM_DIR = f"{G_DIR}/lms/{{lm}}"
G_LM_TABLES = [
    "status",
    "tasks",
    "localization",
    "curves",
    "contrasts",
    "feature_attribution",
]
# MIB's batch weighting needs full batches (as gim.mib's check above)
for _scale, _sized in (("", G_LMS), ("large.", G_LMS["large"])):
    if GIM["weighting"] == "mib" and _sized["n_eval"] % G_LMS["batch_size"]:
        raise WorkflowError(
            f"invalid config:\n  gim.lms.batch_size ({G_LMS['batch_size']}) does not divide "
            f"gim.lms.{_scale}n_eval ({_sized['n_eval']}): under gim.weighting mib every batch must be full"
        )
if LM_NAMES:
    register("gim", [f"{G_DIR}/lms/{lm}/status.csv" for lm in LM_NAMES])


rule gim_lm_data:
    output:
        directory(G_LM_DATA),
    log:
        "logs/gim/lm_data.log",
    conda:
        "../../envs/selfrepair.yaml"
    params:
        tasks=G_LMS["tasks"],
        n_rows=G_LMS["n_rows"],
        seed=GIM["data_seed"],
        code=code_hash("tasks/mib_synth"),
    script:
        "../../scripts/gim_lm_data.py"


rule gim_lm:
    input:
        model=lambda w: lm_folder(w.lm),
        data=G_LM_DATA,
    output:
        **{t: f"{G_LM_DIR}/{t}.csv" for t in G_LM_TABLES},
    log:
        "logs/gim/lm_{lm}.log",
    benchmark:
        "benchmarks/gim/lms/{lm}/run.tsv"
    wildcard_constraints:
        lm="|".join(LM_NAMES) if LM_NAMES else "no-packaged-model",
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
        mem_mb=7000,
    params:
        name="{lm}",
        lms=G_LMS,
        scale=LMS["scale"],
        gim={
            k: GIM[k]
            for k in (
                "fractions",
                "ig_steps",
                "weighting",
                "eactp_max_edges",
                "data_seed",
                "kv_inputs",
                "bos",
            )
        },
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(
            *G_CODE,
            "gim/lm_run",
            "gim/lm_pairs",
            "gim/feature_attribution",
            "tasks/mib",
            "core/models",
            "core/model_files",
        ),
    script:
        "../../scripts/gim_lm.py"
