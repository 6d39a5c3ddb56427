# Pictures of the real-LM results, each drawn from a table the workflow wrote
# (core.real_lms_figures): the claims' forest plot, paper C's faithfulness curves and
# paper B's ROC curves of COAX and the baselines -> results/figures/real_lms/ (RLF_DIR;
# inputs: common.smk's real_lms_figure_inputs).


rule real_lms_forest:
    input:
        claims="results/published/real_lms.csv",
    output:
        report(
            f"{RLF_DIR}/forest.png",
            caption="../report/real_lms_forest.rst",
            category="Real LMs",
        ),
    log:
        "logs/real_lms/forest.log",
    localrule: True
    conda:
        "../../envs/selfrepair.yaml"
    params:
        scale=LMS["scale"],
        code=code_hash("core/real_lms_figures"),
    script:
        "../../scripts/real_lms_forest.py"


rule real_lms_faithfulness:
    input:
        **real_lms_figure_inputs("curves"),
    output:
        report(
            f"{RLF_DIR}/faithfulness.png",
            caption="../report/real_lms_faithfulness.rst",
            category="Real LMs",
        ),
    log:
        "logs/real_lms/faithfulness.log",
    localrule: True
    conda:
        "../../envs/selfrepair.yaml"
    params:
        code=code_hash("core/real_lms_figures", "core/plots"),
    script:
        "../../scripts/real_lms_faithfulness.py"


rule real_lms_roc:
    input:
        **real_lms_figure_inputs("coax"),
    output:
        csv=f"{RLF_DIR}/roc_points.csv",
        png=report(
            f"{RLF_DIR}/roc.png",
            caption="../report/real_lms_roc.rst",
            category="Real LMs",
        ),
    log:
        "logs/real_lms/roc.log",
    localrule: True
    conda:
        "../../envs/selfrepair.yaml"
    params:
        lms=LM_NAMES,
        code=code_hash(
            "core/real_lms_figures", "coax/lm_roc", "coax/baselines", "core/stats"
        ),
    script:
        "../../scripts/real_lms_roc.py"


if LM_NAMES and {"coax", "gim"} & set(PAPERS):
    register("lms", [f"{RLF_DIR}/forest.png"])
if LM_NAMES and "gim" in PAPERS:
    register("lms", [f"{RLF_DIR}/faithfulness.png"])
if LM_NAMES and "coax" in PAPERS:
    register("lms", [f"{RLF_DIR}/roc.png"])
