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


if LM_NAMES and {"coax", "gim"} & set(PAPERS):
    register("lms", ["results/published/real_lms.csv"])
