# Ground truth across the papers: Shapley values of every head and MLP, and
# every attribution method of the three papers on the same models and data.
# per model:  results/groundtruth/models/{heroes/{task}/seed{seed} | ioi/seed{seed} |
#             gim/{gtask}/{gmodel}/seed{gseed}}/{shapley,interactions,scores,timing}.csv, info.json
# tables:     results/groundtruth/tables/agreement.csv (per group, game, method: mean over
#             models, bootstrap CI), agreement_models.csv, shapley.csv, interactions.csv,
#             scores.csv, ioi_labels.csv, ioi_label_sweep.csv, ioi_backup_recall.csv, runtime.csv
# -> results/groundtruth/figures/{agreement,scatter}.png, results/published/groundtruth.csv

GT = config["groundtruth"]
GT_DIR = "results/groundtruth"
GT_SETTINGS = {
    k: GT[k]
    for k in (
        "exact_max_players",
        "max_permutations",
        "min_pairs",
        "rel_se",
        "pairs_per_round",
        "seed",
        "max_rows",
        "n_primary",
        "ig_steps",
    )
}
GT_CODE = code_hash(
    "groundtruth/pipeline",
    "groundtruth/players",
    "groundtruth/methods",
    "groundtruth/games",
    "groundtruth/shapley",
    "core/interventions",
    "core/engine",
    "core/attribution",
    "coax/score",
    "coax/wake_up",
    "gim/backward",
)


GT_LM_TABLES = ("shapley", "interactions", "scores", "agreement", "timing")


GT_COMMON = dict(
    settings=GT_SETTINGS,
    device=DEVICE,
    numerics=NUMERICS,
    code=GT_CODE,
)


# One job per group of models (paper A: a task's seeds; toy IOI: every seed; paper C:
# a task's models and seeds): a job's imports and process start, about 6 CPU-s, are paid
# once per group, not once per model (they were a third to half of a paper-C model's job).
rule groundtruth_heroes:
    input:
        model=lambda wc: [
            j["model"] for j in gt_jobs(gt_heroes_ids(wc.task), data=True)
        ],
        data=lambda wc: [j["data"] for j in gt_jobs(gt_heroes_ids(wc.task), data=True)],
    output:
        gt_out(gt_heroes_ids("{task}")),
    log:
        "logs/groundtruth/heroes/{task}.log",
    benchmark:
        "benchmarks/groundtruth/heroes/{task}.tsv"
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
    params:
        **GT_COMMON,
        family="heroes",
        group="heroes/{task}",
        models=lambda wc: gt_jobs(gt_heroes_ids(wc.task), data=True),
        mode=GT["heroes"]["mode"],
        n_eval=GT["heroes"]["n_eval"],
        games=GT["heroes"]["games"],
    script:
        "../../scripts/groundtruth_model.py"


rule groundtruth_ioi:
    input:
        model=[j["model"] for j in gt_jobs(gt_ioi_ids())],
    output:
        gt_out(gt_ioi_ids()),
    log:
        "logs/groundtruth/ioi.log",
    benchmark:
        "benchmarks/groundtruth/ioi.tsv"
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
    params:
        **GT_COMMON,
        family="ioi",
        group="ioi",
        models=gt_jobs(gt_ioi_ids()),
        mode=GT["ioi"]["mode"],
        n_eval=C_IOI["n_prompts"],
        data_seed=C_IOI["truth_seed"],
    script:
        "../../scripts/groundtruth_model.py"


rule groundtruth_gim:
    input:
        model=lambda wc: [j["model"] for j in gt_jobs(gt_gim_ids(wc.gtask))],
    output:
        gt_out(gt_gim_ids("{gtask}")),
    log:
        "logs/groundtruth/gim/{gtask}.log",
    benchmark:
        "benchmarks/groundtruth/gim/{gtask}.tsv"
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
    params:
        **GT_COMMON,
        family="gim",
        group="gim/{gtask}",
        models=lambda wc: gt_jobs(gt_gim_ids(wc.gtask)),
        task="{gtask}",
        mode=GT["gim"]["mode"],
        n_eval=GIM["n_eval"],
        data_seed=GIM["data_seed"],
    script:
        "../../scripts/groundtruth_model.py"


GT_TABLES = (
    "agreement",
    "agreement_models",
    "shapley",
    "interactions",
    "scores",
    "ioi_labels",
    "ioi_label_sweep",
    "ioi_backup_recall",
    "runtime",
)


rule groundtruth_tables:
    input:
        **{f: expand(f"{GT_DIR}/models/{{m}}/{f}.csv", m=gt_models()) for f in GT_FILES},
        # paper B's own discovery rankings, scored against the corrected toy-IOI labels
        coax_scores=(
            expand(
                f"{C_DIR}/ioi/seed{{s}}/data{{d}}/scores.csv",
                s=C_IOI["seeds"],
                d=C_IOI["data_seeds"],
            )
            if "coax" in PAPERS
            else []
        ),
    output:
        **{t: f"{GT_DIR}/tables/{t}.csv" for t in GT_TABLES},
        published="results/published/groundtruth.csv",
    log:
        "logs/groundtruth/tables.log",
    localrule: True
    conda:
        "../../envs/selfrepair.yaml"
    params:
        top_k=GT["top_k"],
        hidden_single_frac=GT["hidden_single_frac"],
        n_primary=GT["n_primary"],
        backup_frac=GT["backup_frac"],
        label_fracs=GT["label_fracs"],
        n_boot=GT["n_boot"],
        code=code_hash(
            "groundtruth/tables",
            "groundtruth/agreement",
            "groundtruth/labels",
            "coax/baselines",
            "coax/head_gradients",
        ),
    script:
        "../../scripts/groundtruth_tables.py"


rule groundtruth_figures:
    input:
        agreement=f"{GT_DIR}/tables/agreement.csv",
        shapley=f"{GT_DIR}/tables/shapley.csv",
        scores=f"{GT_DIR}/tables/scores.csv",
    output:
        agreement=report(
            f"{GT_DIR}/figures/agreement.png",
            caption="../report/groundtruth.rst",
            category="Ground truth",
        ),
        scatter=report(
            f"{GT_DIR}/figures/scatter.png",
            caption="../report/groundtruth.rst",
            category="Ground truth",
        ),
    log:
        "logs/groundtruth/figures.log",
    localrule: True
    conda:
        "../../envs/selfrepair.yaml"
    params:
        code=code_hash("groundtruth/plots"),
    script:
        "../../scripts/groundtruth_figures.py"


if GT["enabled"] and gt_models():
    register(
        "groundtruth",
        [
            f"{GT_DIR}/figures/agreement.png",
            f"{GT_DIR}/figures/scatter.png",
            "results/published/groundtruth.csv",
        ],
    )


# The packaged real LMs (lms.models): one job per model, on the IOI pairs paper C's
# real-LM rules make (gim.smk's gim_lm_data).
rule groundtruth_lm:
    input:
        model=lambda w: lm_folder(w.lm),
        data="results/lms/data",
    output:
        **{t: f"{GT_DIR}/lms/{{lm}}/{t}.csv" for t in GT_LM_TABLES},
    log:
        "logs/groundtruth/lm_{lm}.log",
    benchmark:
        "benchmarks/groundtruth/lms/{lm}/run.tsv"
    wildcard_constraints:
        lm="|".join(LM_NAMES) if LM_NAMES else "no-packaged-model",
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
        mem_mb=6000,
    params:
        name="{lm}",
        lm=GT["lms"],
        settings={k: v for k, v in GT_SETTINGS.items() if k != "mode"},
        top_k=GT["top_k"],
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(
            "groundtruth/lms", "tasks/mib", "core/models", "core/model_files"
        )
        + GT_CODE,
    script:
        "../../scripts/groundtruth_lm.py"


# on paper C's real-LM IOI pairs: when paper C runs
if GT["enabled"] and LM_NAMES and "gim" in PAPERS:
    register("groundtruth", [f"{GT_DIR}/lms/{lm}/shapley.csv" for lm in LM_NAMES])
