# Paper A: Hidden Heroes and Gradient Bloats.
# results/heroes/{task}/seed{seed}/model -> ood.json + ood_batches.pt
# -> gradients.csv + ablations.csv + outcomes.pt (heroes_scores) -> roles.csv (with role
#    stability over resampled evaluation sequences)
# -> redundancy.csv, pruning.csv, attention.csv (heroes_probe)
# -> results/heroes/tables/*.csv -> results/heroes/figures/*.{png,pdf}


HEROES = config["heroes"]
if HEROES["train"]["min_len"] > HEROES["train"]["max_len"]:
    raise WorkflowError(
        f"invalid config: heroes.train.min_len ({HEROES['train']['min_len']}) "
        f"> heroes.train.max_len ({HEROES['train']['max_len']})"
    )
if HEROES["ood"]["window"][0] > HEROES["ood"]["window"][1]:
    raise WorkflowError(
        f"invalid config: heroes.ood.window {HEROES['ood']['window']} is empty"
    )
if min(HEROES["ood"]["lengths"]) <= HEROES["train"]["max_len"]:
    raise WorkflowError(
        f"invalid config: heroes.ood.lengths {HEROES['ood']['lengths']} must all exceed "
        f"heroes.train.max_len ({HEROES['train']['max_len']}): they are out of distribution"
    )
H_TASKS = HEROES["tasks"]
H_SEEDS = HEROES["seeds"]
H_SEED_DIR = "results/heroes/{task}/seed{seed}"
H_TABLES = "results/heroes/tables"
H_FIGS = "results/heroes/figures"
H_PROTOCOL = (
    f"padding={HEROES['train']['padding']}, init={HEROES['model']['init']}, "
    f"G={HEROES['scores']['g_normalization']}, C={HEROES['scores']['ablation']} ablation at hook_z, "
    f"n_eval={HEROES['scores']['n_eval']}"
)
H_FIGURES = [
    "g_vs_c",
    "waterfall",
    "roles_by_layer",
    "role_stability",
    "redundancy",
    "pruning",
    "attention",
]


wildcard_constraints:
    task="|".join(H_TASKS),
    seed=r"\d+",


register(
    "heroes",
    [f"{H_FIGS}/{f}.{ext}" for f in H_FIGURES for ext in ("png", "pdf")]
    + ["results/published/heroes.csv"],
)


rule heroes_train:
    output:
        model=directory(f"{H_SEED_DIR}/model"),
        log_csv=f"{H_SEED_DIR}/train_log.csv",
        meta=f"{H_SEED_DIR}/train.json",
    log:
        "logs/heroes/{task}/seed{seed}/train.log",
    benchmark:
        "benchmarks/heroes/{task}/seed{seed}/train.tsv"
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
    params:
        task="{task}",
        seed="{seed}",
        model=HEROES["model"],
        train=HEROES["train"],
        max_length=max(HEROES["ood"]["lengths"]),
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(
            "core/models",
            "core/model_files",
            "core/train",
            "core/engine",
            "heroes/scores",
            "tasks/sequences",
        ),
    script:
        "../../scripts/heroes_train.py"


rule heroes_ood:
    input:
        model=f"{H_SEED_DIR}/model",
    output:
        ood=f"{H_SEED_DIR}/ood.json",
        batches=f"{H_SEED_DIR}/ood_batches.pt",
    log:
        "logs/heroes/{task}/seed{seed}/ood.log",
    benchmark:
        "benchmarks/heroes/{task}/seed{seed}/ood.tsv"
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    params:
        task="{task}",
        seed="{seed}",
        lengths=HEROES["ood"]["lengths"],
        window=HEROES["ood"]["window"],
        n_select=HEROES["ood"]["n_select"],
        n_batches=HEROES["ood"]["n_batches"],
        batch_size=HEROES["ood"]["batch_size"],
        n_eval=HEROES["scores"]["n_eval"],
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(
            "core/models",
            "core/model_files",
            "core/engine",
            "heroes/scores",
            "tasks/sequences",
        ),
    script:
        "../../scripts/heroes_ood.py"


rule heroes_scores:
    input:
        model=f"{H_SEED_DIR}/model",
        batches=f"{H_SEED_DIR}/ood_batches.pt",
    output:
        gradients=f"{H_SEED_DIR}/gradients.csv",
        ablations=f"{H_SEED_DIR}/ablations.csv",
        outcomes=f"{H_SEED_DIR}/outcomes.pt",
    log:
        "logs/heroes/{task}/seed{seed}/scores.log",
    benchmark:
        "benchmarks/heroes/{task}/seed{seed}/scores.tsv"
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
    params:
        normalization=HEROES["scores"]["g_normalization"],
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(
            "core/models",
            "core/model_files",
            "core/attribution",
            "core/engine",
            "heroes/scores",
            "core/components",
            "heroes/spread",
        ),
    script:
        "../../scripts/heroes_scores.py"


rule heroes_roles:
    input:
        ood=f"{H_SEED_DIR}/ood.json",
        gradients=f"{H_SEED_DIR}/gradients.csv",
        ablations=f"{H_SEED_DIR}/ablations.csv",
        outcomes=f"{H_SEED_DIR}/outcomes.pt",
    output:
        csv=f"{H_SEED_DIR}/roles.csv",
    log:
        "logs/heroes/{task}/seed{seed}/roles.log",
    localrule: True
    conda:
        "../../envs/selfrepair.yaml"
    params:
        task="{task}",
        seed=lambda wc: int(wc.seed),
        ablation=HEROES["scores"]["ablation"],
        threshold=HEROES["roles"]["threshold"],
        thresholds=HEROES["roles"]["thresholds"],
        n_boot=HEROES["roles"]["n_boot"],
        stable_share=HEROES["roles"]["stable_share"],
        code=code_hash("core/analysis", "core/components", "heroes/spread"),
    script:
        "../../scripts/heroes_roles.py"


rule heroes_probe:
    input:
        model=f"{H_SEED_DIR}/model",
        batches=f"{H_SEED_DIR}/ood_batches.pt",
        roles=f"{H_SEED_DIR}/roles.csv",
        outcomes=f"{H_SEED_DIR}/outcomes.pt",
    output:
        redundancy=f"{H_SEED_DIR}/redundancy.csv",
        pruning=f"{H_SEED_DIR}/pruning.csv",
        attention=f"{H_SEED_DIR}/attention.csv",
        patterns=f"{H_SEED_DIR}/attention_patterns.csv",
    log:
        "logs/heroes/{task}/seed{seed}/probe.log",
    benchmark:
        "benchmarks/heroes/{task}/seed{seed}/probe.tsv"
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
    params:
        task="{task}",
        seed=lambda wc: int(wc.seed),
        ablation=HEROES["scores"]["ablation"],
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(
            "core/models",
            "core/model_files",
            "core/engine",
            "heroes/scores",
            "core/components",
        ),
    script:
        "../../scripts/heroes_probe.py"


rule heroes_aggregate:
    input:
        ood=heroes_per_seed("ood.json"),
        train=heroes_per_seed("train.json"),
        roles=heroes_per_seed("roles.csv"),
        redundancy=heroes_per_seed("redundancy.csv"),
        pruning=heroes_per_seed("pruning.csv"),
        attention=heroes_per_seed("attention.csv"),
        patterns=heroes_per_seed("attention_patterns.csv"),
    output:
        seeds=report(
            f"{H_TABLES}/seeds.csv",
            caption="../report/heroes_tables.rst",
            category="Paper A (Hidden Heroes)",
            subcategory="Tables",
        ),
        rho=report(
            f"{H_TABLES}/rho.csv",
            caption="../report/heroes_tables.rst",
            category="Paper A (Hidden Heroes)",
            subcategory="Tables",
        ),
        run_summary=report(
            f"{H_TABLES}/run_summary.csv",
            caption="../report/heroes_tables.rst",
            category="Paper A (Hidden Heroes)",
            subcategory="Tables",
        ),
        components=report(
            f"{H_TABLES}/components.csv",
            caption="../report/heroes_tables.rst",
            category="Paper A (Hidden Heroes)",
            subcategory="Tables",
        ),
        roles_by_layer=report(
            f"{H_TABLES}/roles_by_layer.csv",
            caption="../report/heroes_tables.rst",
            category="Paper A (Hidden Heroes)",
            subcategory="Tables",
        ),
        role_stability=report(
            f"{H_TABLES}/role_stability.csv",
            caption="../report/heroes_tables.rst",
            category="Paper A (Hidden Heroes)",
            subcategory="Tables",
        ),
        gradient_by_layer=report(
            f"{H_TABLES}/gradient_by_layer.csv",
            caption="../report/heroes_tables.rst",
            category="Paper A (Hidden Heroes)",
            subcategory="Tables",
        ),
        redundancy=f"{H_TABLES}/redundancy.csv",
        redundancy_summary=report(
            f"{H_TABLES}/redundancy_summary.csv",
            caption="../report/heroes_tables.rst",
            category="Paper A (Hidden Heroes)",
            subcategory="Tables",
        ),
        pruning=f"{H_TABLES}/pruning.csv",
        attention=f"{H_TABLES}/attention.csv",
        patterns=f"{H_TABLES}/attention_patterns.csv",
    log:
        "logs/heroes/aggregate.log",
    localrule: True
    conda:
        "../../envs/selfrepair.yaml"
    params:
        thresholds=HEROES["roles"]["thresholds"],
        code=code_hash("heroes/tables", "core/analysis"),
    script:
        "../../scripts/heroes_aggregate.py"


H_FIGURE_INPUTS = {
    "g_vs_c": ["components", "rho"],
    "waterfall": ["components"],
    "roles_by_layer": ["roles_by_layer"],
    "role_stability": ["role_stability"],
    "redundancy": ["redundancy_summary"],
    "pruning": ["pruning"],
    "attention": ["attention", "patterns"],
}
H_TABLE_FILE = {"patterns": "attention_patterns"}


for _fig, _tables in H_FIGURE_INPUTS.items():

    rule:
        name:
            f"heroes_fig_{_fig}"
        input:
            **{t: f"{H_TABLES}/{H_TABLE_FILE.get(t, t)}.csv" for t in _tables},
        output:
            report(
                f"{H_FIGS}/{_fig}.png",
                caption=f"../report/heroes_{_fig}.rst",
                category="Paper A (Hidden Heroes)",
            ),
            f"{H_FIGS}/{_fig}.pdf",
        log:
            f"logs/heroes/fig_{_fig}.log",
        localrule: True
        conda:
            "../../envs/selfrepair.yaml"
        params:
            figure=_fig,
            threshold=HEROES["roles"]["threshold"],
            code=code_hash("core/plots"),
        script:
            "../../scripts/heroes_figure.py"


rule heroes_published:
    input:
        **(
            {"grid_claims": "results/heroes/grid/tables/claims.csv"}
            if "authors" in HEROES["grid"]["cells"]
            else {}
        ),
        claims=PUBLISHED,
        seeds=f"{H_TABLES}/seeds.csv",
        rho=f"{H_TABLES}/rho.csv",
        roles_by_layer=f"{H_TABLES}/roles_by_layer.csv",
        role_stability=f"{H_TABLES}/role_stability.csv",
        gradient_by_layer=f"{H_TABLES}/gradient_by_layer.csv",
        redundancy_summary=f"{H_TABLES}/redundancy_summary.csv",
        attention=f"{H_TABLES}/attention.csv",
        components=f"{H_TABLES}/components.csv",  # per seed: the role counts' and G's CIs over seeds
        # each claim under the authors'-code protocol too: the grid's 'authors' cell
    output:
        csv=report(
            "results/published/heroes.csv",
            caption="../report/published.rst",
            category="Published vs reproduced",
        ),
    log:
        "logs/heroes/published.log",
    localrule: True
    conda:
        "../../envs/selfrepair.yaml"
    params:
        threshold=HEROES["roles"]["threshold"],
        thresholds=HEROES["roles"]["thresholds"],
        protocol=H_PROTOCOL,
        authors_seeds=len(HEROES["grid"]["main_seeds"]),
        code=code_hash(
            "heroes/claims", "heroes/grid_claims", "core/published", "core/analysis"
        ),
    script:
        "../../scripts/heroes_published.py"
