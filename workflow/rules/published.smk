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
