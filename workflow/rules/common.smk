# Shared helpers: config validation, code hashing, target registry.
import hashlib
import os
import sys as _sys
from pathlib import Path

SCHEMAS = Path(workflow.basedir) / "workflow" / "schemas"
_sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from selfrepair.core import numerics as _numerics  # noqa: E402  imports no torch
from selfrepair.core import local_files as _local_files  # noqa: E402  imports no torch
from selfrepair.core import published as _published  # noqa: E402  imports no torch
from selfrepair.core import yaml_text as _yaml_text  # noqa: E402  imports no torch
from selfrepair.core import config_schema as _schema  # noqa: E402  imports no torch


def check_config(section, schema_name, where):
    """Validate one config section; every error names its key, before any job starts.
    Then the schema's defaults are filled in (selfrepair.core.config_schema: as
    snakemake.utils.validate does, from the schema read once). Returns the schema."""
    schema = _yaml_text.load((SCHEMAS / schema_name).read_text())
    problems = _schema.problems(section, schema, where)
    if problems:
        raise WorkflowError("invalid config:\n" + "\n".join(f"  {p}" for p in problems))
    _schema.fill_defaults(section, schema)
    return schema


if config.get("numerics") in _numerics.RENAMED:
    raise WorkflowError(
        f"invalid config:\n  numerics: {_numerics.RENAMED[config['numerics']]}"
    )
check_config(config, "config.schema.yaml", "")
for _paper in ("heroes", "coax", "gim", "groundtruth", "lms"):
    if (SCHEMAS / f"{_paper}.schema.yaml").exists():
        config.setdefault(_paper, {})
        check_config(config[_paper], f"{_paper}.schema.yaml", _paper)


def config_problems(node, where=""):
    """What the schemas cannot say: a number that is NaN or infinite (``lr: .nan`` would
    otherwise reach training), heads that do not divide the width, and two list entries
    with the same ``name`` (the second would silently replace the first)."""
    import math

    out = []
    if isinstance(node, float) and not math.isfinite(node):
        out.append(f"{where}: {node} is not a finite number")
    elif isinstance(node, dict):
        h, d = node.get("n_heads"), node.get("d_model")
        if isinstance(h, int) and isinstance(d, int) and h > 0 and d % h:
            out.append(f"{where}: n_heads ({h}) does not divide d_model ({d})")
        for k, v in node.items():
            out += config_problems(v, f"{where}.{k}" if where else str(k))
    elif isinstance(node, list):
        names = [x.get("name") for x in node if isinstance(x, dict) and "name" in x]
        for n in sorted({n for n in names if names.count(n) > 1}, key=str):
            out.append(
                f"{where}: name {n!r} appears {names.count(n)} times (each entry needs its own name)"
            )
        for i, v in enumerate(node):
            out += config_problems(v, f"{where}.{i}")
    return out


_problems = config_problems(dict(config))
if _problems:
    raise WorkflowError("invalid config:\n" + "\n".join(f"  {p}" for p in _problems))

SRC = Path(workflow.basedir) / "src" / "selfrepair"
from selfrepair.core.runtime import cuda_available as _cuda_available  # noqa: E402

PAPERS = list(config["papers"])
DEVICE = config["device"]

# The numerics mode (src/selfrepair/core/numerics.py): its pins go into this process's
# environment, which every job inherits (locally and on a cluster node, where the job
# parses this file again), before any job imports torch. Pinned modes run one thread.
NUMERICS = config["numerics"]
try:
    _numerics.configure(NUMERICS, config["threads"])
except (_numerics.NumericsError, OSError) as _err:
    # the cause and the fix, without a traceback
    raise WorkflowError(str(_err)) from None
COMPUTE_THREADS = _numerics.job_threads(NUMERICS, config["threads"])
# resources: gpu=GPU_JOB in every compute rule: 1 when its jobs will use a GPU, so that
# `--resources gpu=1` serializes them there; 0 on a CPU-only machine even for device auto.
# Device auto is resolved here, once (runtime.cuda_available: no torch import without a
# GPU device node). On a cluster that is the login node's answer: set device=cuda there
# (workflow/profiles/slurm then asks sbatch for one GPU per compute job).
GPU_JOB = int(DEVICE != "cpu" and (DEVICE != "auto" or _cuda_available()))
# device cuda without CUDA here: refused before any job starts, where the jobs run on this
# machine. Not where they may run elsewhere: a cluster executor needs --jobs (the slurm
# and local-cluster profiles set it; for local runs Snakemake turns --jobs into --cores),
# nor in a job's own parse on a cluster node (the CPU-only jobs of a GPU run go there too);
# a compute job without CUDA stops at its start (core.device.resolve_device).
# SELFREPAIR_ASSUME_CUDA=1 plans a GPU run from a machine without one (a dry run);
# SELFREPAIR_EMULATE_CUDA=1 runs it on an emulated CUDA device (core/emulated_cuda.py).
if (
    DEVICE == "cuda"
    and workflow.is_main_process
    and workflow.resource_settings.nodes is None
    and os.environ.get("SELFREPAIR_ASSUME_CUDA") != "1"
    and os.environ.get("SELFREPAIR_EMULATE_CUDA") != "1"
    and not _cuda_available()
):
    raise WorkflowError(
        "invalid config:\n  device: 'cuda', but CUDA is not available on this machine, "
        "where the jobs would run: set device=auto (a GPU where there is one) or cpu, or run "
        "on a machine with a GPU (or a cluster's: --workflow-profile workflow/profiles/slurm); "
        "SELFREPAIR_ASSUME_CUDA=1 lets a dry run plan a GPU run from here"
    )
TARGETS = {}  # paper -> list of final files, filled by each paper's rule file
# The published claims: relative to the working directory, else to the workflow (so that
# `--directory elsewhere` finds the repository's config/published.yaml). Missing in both:
# the run stops here, at parse time, naming the path (a finished run's directory
# otherwise reported "Nothing to be done").
_published_where = [
    Path(config["published"]),
    Path(workflow.basedir) / config["published"],
]
_published_found = [p for p in _published_where if p.is_file()]
if not _published_found:
    raise WorkflowError(
        f"config key published: the published-claims file {config['published']} does not exist "
        f"(looked for {_published_where[0].resolve()} and {_published_where[1]}); restore it "
        "(git checkout config/published.yaml) or set --config published=PATH"
    )
PUBLISHED = str(_published_found[0])
# Each claim there with its number and tolerance (or its text): checked here, not first
# in the job that compares it, hours later (selfrepair.core.published.file_problems).
_problems = _published.file_problems(PUBLISHED)
if _problems:
    raise WorkflowError(
        "invalid config:\n"
        + "\n".join(
            f"  published: {_published_found[0].resolve()}: {p}" for p in _problems
        )
    )


def code_hash(*modules):
    """Hash of library modules (paths under src/selfrepair, without .py).

    Passed through params:, so that editing the library code a rule uses reruns it.
    """
    h = hashlib.sha256()
    for m in sorted(modules):
        f = SRC / f"{m}.py"
        if not f.exists():
            raise WorkflowError(f"code_hash: no library module {f}")
        h.update(m.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def register(paper, files):
    TARGETS.setdefault(paper, []).extend(files)


def all_targets():
    out = []
    for p in PAPERS + ["lms", "groundtruth", "own"]:
        out.extend(TARGETS.get(p, []))
    out.append("results/published/summary.csv")
    return out


def heroes_per_seed(name):
    """Paper A: one file per (task, seed) of the config."""
    h = config["heroes"]
    return expand(
        "results/heroes/{task}/seed{seed}/{name}",
        task=h["tasks"],
        seed=h["seeds"],
        name=name,
    )


# ---- Paper A's protocol grid (heroes_grid.smk defines GRID, GRID_PROTO, GRID_JOBS) ----


def grid_cell_seeds(cell):
    return GRID["main_seeds"] if cell in ("default", "authors") else GRID["seeds"]


def grid_model_dir(key, task, seed):
    if key == GRID_MAIN_KEY:
        return f"results/heroes/{task}/seed{seed}"
    return f"{GRID_DIR}/train/{key}/{task}/seed{seed}"


def grid_cells(wc):
    cells = GRID_JOBS.get((wc.tkey, wc.task, int(wc.seed)))
    if not cells:
        raise WorkflowError(
            f"no protocol cell uses model {wc.tkey}/{wc.task}/seed{wc.seed}"
        )
    return {c: GRID_PROTO[c] for c in cells}


def grid_sweep(wc):
    return GRID["n_eval_sweep"] if wc.tkey == GRID_MAIN_KEY else []


def grid_n_measure(wc):
    return max([p["n_eval"] for p in grid_cells(wc).values()] + list(grid_sweep(wc)))


def grid_measured(name):
    return [
        f"{GRID_DIR}/measure/{k}/{t}/seed{s}/{name}" for (k, t, s) in sorted(GRID_JOBS)
    ]


def grid_model_input(name):
    """Input function: a file of the model a grid job measures."""
    return lambda wc: str(Path(grid_model_dir(wc.tkey, wc.task, wc.seed)) / name)


# ---- Ground truth (groundtruth.smk; C_IOI, GIM, G_MODELS, G_SEEDS from coax/gim.smk) ----


GT_FILES = ("shapley", "interactions", "scores", "timing")  # per model


def gt_heroes_ids(task):
    """Paper A's ground-truth models of ``task``: the ground truth's seeds that paper A trains."""
    seeds = config["groundtruth"]["heroes"]["seeds"]
    return [f"heroes/{task}/seed{s}" for s in seeds if s in config["heroes"]["seeds"]]


def gt_ioi_ids():
    return [f"ioi/seed{s}" for s in C_IOI["seeds"]]


def gt_gim_ids(task):
    return [f"gim/{task}/{m}/seed{s}" for m in G_MODELS for s in G_SEEDS]


def gt_source(model_id):
    """The run folder of the trained model behind a ground-truth model id (holding
    ``model/``; paper A's also ``ood_batches.pt``)."""
    family, rest = model_id.split("/", 1)
    roots = {"heroes": "results/heroes", "ioi": f"{C_DIR}/ioi", "gim": G_DIR}
    return f"{roots[family]}/{rest}"


def gt_jobs(model_ids, data=False):
    """A ground-truth job's ``models`` param: per model its id, model folder and (paper A)
    its OOD batches."""
    return [
        {
            "id": m,
            "model": f"{gt_source(m)}/model",
            **({"data": f"{gt_source(m)}/ood_batches.pt"} if data else {}),
        }
        for m in model_ids
    ]


def gt_models():
    """Model ids of every family whose paper runs: heroes/{task}/seed{s}, ioi/seed{s},
    gim/{task}/{model}/seed{s}."""
    out = []
    if "heroes" in PAPERS:
        out += [m for t in config["heroes"]["tasks"] for m in gt_heroes_ids(t)]
    if "coax" in PAPERS:
        out += gt_ioi_ids()
    if "gim" in PAPERS:
        out += [m for t in GIM["tasks"] for m in gt_gim_ids(t)]
    return out


def gt_out(prefixes):
    """The files one ground-truth job writes: per model id (a pattern: wildcards stay)
    its tables and info.json."""
    d = "results/groundtruth/models"
    return [
        f"{d}/{p}/{f}"
        for p in prefixes
        for f in [f"{t}.csv" for t in GT_FILES] + ["info.json"]
    ]


# ---- Own models (own.smk defines OWN, OWN_BY_NAME, OWN_DIR, OWN_CAPTIONS; GIM, GT, COAX) ----


def own_settings(name, kind):
    """An entry's settings for one analysis: its own keys, then the papers' sections'."""
    s = dict(OWN_BY_NAME[name])
    s.setdefault("methods", list(GIM["methods"]))
    s.setdefault("batch_size", 16 if kind == "g_vs_c" else 32)
    s.update(
        fractions=list(GIM["fractions"]),
        ig_steps=GIM["ig_steps"],
        weighting="example",  # every pair weighs alike, whatever the batches
        kv_inputs=GIM["kv_inputs"],
        bos=GIM["bos"],
        tie_orders=GIM["ifr_tie_orders"],
        eactp_max_edges=GIM["eactp_max_edges"],
        circuit_fraction=GIM["circuit_fraction"],
        settings=dict(GT_SETTINGS),
        top_k=GT["top_k"],
        single_frac=GT["hidden_single_frac"],
        top_r=COAX["top_r"],
        max_rows=COAX["max_rows"],
        role_threshold=config["heroes"]["roles"]["threshold"],
    )
    return s


def own_outputs(kind):
    out = {t: f"{OWN_DIR}/{{name}}/{kind}/{t}.csv" for t in _own.TABLES[kind]}
    shown = OWN_CAPTIONS[kind]
    out[shown] = report(
        out[shown],
        caption=f"../report/own_{kind}.rst",
        category="Own models",
        subcategory="{name}",
    )
    if kind == "edges":
        out["circuits"] = directory(f"{OWN_DIR}/{{name}}/edges/circuits")
    out["status"] = f"{OWN_DIR}/{{name}}/{kind}/status.csv"
    return out


def own_status_files(wildcards=None):
    """Every analysis's status row; asked for with an empty own: section, the way out."""
    if not OWN:
        raise WorkflowError(_own.EMPTY)
    return [f"{OWN_DIR}/{e['name']}/{k}/status.csv" for e in OWN for k in e["analyses"]]


# ---- GGUF files (lms.smk converts them: rule lm_convert) ----------------------------
# a user's .gguf files named where a model is (own: entries with their search paths,
# coax.real's and gim.mib's model lists with those sections' search paths) that exist
# here: {<stem>-<sha16>: path}
_REAL = config["coax"].get("real", {})
_MIB = config["gim"].get("mib", {})
_GGUF_SEARCH = [*_REAL.get("search_paths", []), *_MIB.get("search_paths", [])]
_GGUF_NAMED = [
    (e.get("model", ""), e.get("search_paths") or [], f"own.{i}.model")
    for i, e in enumerate(config.get("own") or [])
] + [
    (n, _GGUF_SEARCH, where)
    for where, names in (
        ("coax.real.ioi_model", [_REAL.get("ioi_model", "")]),
        ("coax.real.wakeup_models", _REAL.get("wakeup_models", [])),
        ("coax.real.induction_models", _REAL.get("induction_models", [])),
        ("gim.mib.models", _MIB.get("models", [])),
    )
    for n in names
]
GGUF_FILES, _problems = _local_files.named_files(_GGUF_NAMED)
if _problems:
    raise WorkflowError("invalid config:\n" + "\n".join(f"  {p}" for p in _problems))
# a file gone, its converted folder kept: said once, at parse
if workflow.is_main_process:
    for _line in _local_files.gone_files(_GGUF_NAMED):
        print(_line, file=_sys.stderr)


def lm_folder(lm):
    """The model folder of a packaged LM or a user's GGUF file (its file_key)."""
    return f"{_local_files.LMS_DIR}/{lm}/model"


def gguf_inputs(names, search_paths=None):
    """The converted folders of the user's GGUF files among model names (a rule's inputs),
    found as paths or under ``search_paths`` (by default coax.real's and gim.mib's); of a
    file gone since its conversion, the folder it was converted into."""
    paths = _GGUF_SEARCH if search_paths is None else search_paths
    keys = [
        _local_files.gguf_key(n, paths) for n in names if _local_files.is_gguf_path(n)
    ]
    return [lm_folder(k) for k in keys if k is not None]


# ---- The packaged real LMs' analyses (coax.smk, gim.smk, published.smk) ----


def coax_lms_settings():
    """coax.lms at the scale of config lms.scale: the shared keys with that scale's sizes
    (the pruning block is rule coax_lm_pruning's; at a scale where it runs, coax_lm's
    pruning row points to it)."""
    lms_cfg = config["coax"]["lms"]
    shared = {
        k: v for k, v in lms_cfg.items() if k not in ("default", "large", "pruning")
    }
    if LM_PRUNING:
        shared["pruning_note"] = (
            "rule coax_lm_pruning runs it (its status.csv beside its tables)"
        )
    return {**shared, **lms_cfg[config["lms"]["scale"]]}


# paper B's pruning on the packaged LMs runs at the scales coax.lms.pruning.scales names
LM_PRUNING = config["lms"]["scale"] in config["coax"]["lms"]["pruning"]["scales"]


def coax_lm_pruning_problems(pr):
    """coax.lms.pruning settings the schema cannot check."""
    out = []
    if pr["calibration"] == pr["evaluation"]:
        out.append(
            f"coax.lms.pruning: calibration and evaluation are both {pr['calibration']!r}: the heads "
            "must be scored on another text than the perplexity is measured on"
        )
    if pr["length"] <= pr["stride"]:
        out.append(
            f"coax.lms.pruning.stride {pr['stride']} keeps one position of a {pr['length']}-token window"
        )
    return out


def coax_lms_problems(lms_cfg):
    """coax.lms sizes the schema cannot check: the seeds are chosen again on each half of
    the truth prompts, so every template needs two of them."""
    need = 2 * len(lms_cfg["templates"])
    return [
        f"coax.lms.{scale}.n_truth: {lms_cfg[scale]['n_truth']} truth prompts leave a half of them without a "
        f"template (the seeds are chosen again on each half): at least {need} for templates "
        f"{', '.join(lms_cfg['templates'])}"
        for scale in ("default", "large")
        if lms_cfg[scale]["n_truth"] < need
    ]


_problems = coax_lms_problems(config["coax"]["lms"]) + coax_lm_pruning_problems(
    config["coax"]["lms"]["pruning"]
)
if _problems:
    raise WorkflowError("invalid config:\n" + "\n".join(f"  {p}" for p in _problems))


def no_real_lms(wildcards=None):
    """The input of real_lms_claims when no real LM runs: asked for, the way out."""
    raise WorkflowError(_published.no_real_lms(LM_NAMES, PAPERS))


def gim_lms_sizes():
    """gim.lms at the scale of config lms.scale: its large sizes over the default's."""
    lms_cfg = config["gim"]["lms"]
    shared = {k: v for k, v in lms_cfg.items() if k != "large"}
    return {**shared, **(lms_cfg["large"] if config["lms"]["scale"] == "large" else {})}


def real_lms_status_inputs():
    """The status tables of the real-LM jobs (each part's measured CPU time), per packaged
    LM and paper that runs: the inputs of real_lms_power beside the claims."""
    out = {}
    for lm in LM_NAMES:
        if "coax" in PAPERS:
            out[f"coax_status_{lm}"] = f"results/coax/lms/{lm}/status.csv"
            if LM_PRUNING:
                out[f"coax_status_pruning_{lm}"] = (
                    f"results/coax/lms/{lm}/pruning/status.csv"
                )
        if "gim" in PAPERS:
            out[f"gim_status_{lm}"] = f"results/gim/lms/{lm}/status.csv"
    return out


def real_lms_inputs():
    """The inputs of real_lms_claims: per packaged LM, paper B's tables folder and paper C's
    tasks, contrasts and feature-attribution tables (of the papers that run); with no
    packaged LM or neither paper, :func:`no_real_lms` (a header-only table said nothing).
    """
    if not LM_NAMES or not {"coax", "gim"} & set(PAPERS):
        return {"none": no_real_lms}
    out = {}
    for lm in LM_NAMES:
        if "coax" in PAPERS:
            out[f"coax_{lm}"] = f"results/coax/lms/{lm}/tables"
            if LM_PRUNING:
                out[f"coax_pruning_{lm}"] = (
                    f"results/coax/lms/{lm}/pruning/sequences.csv"
                )
        if "gim" in PAPERS:
            for t, f in (
                ("tasks", "tasks"),
                ("contrasts", "contrasts"),
                ("fa", "feature_attribution"),
            ):
                out[f"gim_{t}_{lm}"] = f"results/gim/lms/{lm}/{f}.csv"
    return out


# ---- The real-LM pictures (real_lms_figures.smk; G_DIR, C_DIR from gim.smk, coax.smk) ----
RLF_DIR = "results/figures/real_lms"


def real_lms_figure_inputs(kind):
    """Per packaged LM, the table a figure draws: paper C's curves.csv (``curves``) or paper
    B's tables folder (``coax``); with no LM configured, an input that says so when asked.
    """
    if not LM_NAMES:

        def none(wildcards=None):
            raise WorkflowError(
                f"{RLF_DIR}: no real LM is configured (lms.models is empty), so there is nothing to "
                "draw. Name packaged models in lms.models, or leave the figure out of the targets"
            )

        return {"none": none}
    if kind == "curves":
        return {"curves": [f"{G_DIR}/lms/{lm}/curves.csv" for lm in LM_NAMES]}
    return {f"coax_{lm}": f"{C_DIR}/lms/{lm}/tables" for lm in LM_NAMES}
