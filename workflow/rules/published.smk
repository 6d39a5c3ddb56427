# Published vs reproduced: one table per paper, merged; strict mode fails on "differs".


rule published_summary:
    input:
        expand("results/published/{paper}.csv", paper=PAPERS),
        # the ground truth's findings ("new" rows), when it runs
        [
            f
            for f in TARGETS.get("groundtruth", [])
            if f.startswith("results/published/")
        ],
    output:
        csv=report(
            "results/published/summary.csv",
            caption="../report/published.rst",
            category="Published vs reproduced",
        ),
    log:
        "logs/published_summary.log",
    localrule: True
    conda:
        "../../envs/selfrepair.yaml"
    params:
        strict=config["strict"],
        numerics=NUMERICS,
        code=code_hash("core/published", "core/yaml_text"),
    script:
        "../../scripts/published_summary.py"


# Papers B and C's claims about their methods, tested on each packaged real LM
# (core.real_claims; inputs: common.smk's real_lms_inputs).
rule real_lms_claims:
    input:
        **real_lms_inputs(),
    output:
        csv=report(
            "results/published/real_lms.csv",
            caption="../report/real_lms.rst",
            category="Published vs reproduced",
        ),
    log:
        "logs/real_lms_claims.log",
    localrule: True
    conda:
        "../../envs/selfrepair.yaml"
    params:
        lms=LM_NAMES,
        papers=PAPERS,
        backup_share=config["coax"]["lms"]["backup_share"],
        pruning_headline=config["coax"]["lms"]["pruning"]["headline"],
        code=code_hash(
            "core/real_claims",
            "coax/lm_claims",
            "coax/lm_seeds",
            "gim/lm_claims",
            "coax/baselines",
            "core/stats",
        ),
    script:
        "../../scripts/real_lms_claims.py"


# The power of those claims (core.real_power): per claim, the n that would decide it if
# its effect stayed, and that n's cost from the CPU time each part of the run measured.
rule real_lms_power:
    input:
        **real_lms_status_inputs(),
        claims="results/published/real_lms.csv",
    output:
        csv=report(
            "results/published/real_lms_power.csv",
            caption="../report/real_lms_power.rst",
            category="Published vs reproduced",
        ),
    log:
        "logs/real_lms_power.log",
    localrule: True
    conda:
        "../../envs/selfrepair.yaml"
    params:
        lms=LM_NAMES,
        coax_sizes=coax_lms_settings(),
        pruning_n_eval=config["coax"]["lms"]["pruning"]["n_eval"],
        gim_sizes=gim_lms_sizes(),
        code=code_hash("core/real_power", "core/real_claims"),
    script:
        "../../scripts/real_lms_power.py"


if LM_NAMES and {"coax", "gim"} & set(PAPERS):
    register(
        "lms",
        ["results/published/real_lms.csv", "results/published/real_lms_power.csv"],
    )
