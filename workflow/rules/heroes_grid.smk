# Paper A's protocol grid: which protocol choices move the published numbers.
# Cells and their protocols: src/selfrepair/heroes/grid.py. Models are shared between cells of
# one training key ({padding}-{init}); the default key's models are the main run's.
# model -> heroes_grid_measure (every cell of that model) -> heroes_grid_tables -> figures
from selfrepair.heroes import grid as _grid  # noqa: E402  pure Python: builds the DAG

GRID = HEROES["grid"]
GRID_BASE = _grid.base_protocol(HEROES)
GRID_PROTO = {c: _grid.cell_protocol(c, GRID_BASE) for c in GRID["cells"]}
GRID_MAIN_KEY = _grid.train_key(GRID_BASE)
GRID_DIR = "results/heroes/grid"
GRID_TABLES = f"{GRID_DIR}/tables"
GRID_FIGS = f"{GRID_DIR}/figures"


GRID_JOBS = {}  # (training key, task, seed) -> cells measured on that model
for _cell, _proto in GRID_PROTO.items():
    for _task in H_TASKS:
        for _seed in grid_cell_seeds(_cell):
            GRID_JOBS.setdefault(
                (_grid.train_key(_proto), _task, int(_seed)), []
            ).append(_cell)


wildcard_constraints:
    tkey="per_(batch|example)-(transformers|torch)",


GRID_FIGURES = {
    "rho": ["seeds", "rho"],
    "rho_vs_n": ["noise"],
    "superadditivity": ["superadditivity"],
}
if GRID["cells"]:
    register(
        "heroes",
        [f"{GRID_FIGS}/{f}.{ext}" for f in GRID_FIGURES for ext in ("png", "pdf")]
        + [f"{GRID_TABLES}/claims.csv"],
    )


use rule heroes_train as heroes_grid_train with:
    output:
        model=directory(f"{GRID_DIR}/train/{{tkey}}/{{task}}/seed{{seed}}/model"),
        log_csv=f"{GRID_DIR}/train/{{tkey}}/{{task}}/seed{{seed}}/train_log.csv",
        meta=f"{GRID_DIR}/train/{{tkey}}/{{task}}/seed{{seed}}/train.json",
    log:
        "logs/heroes/grid/{tkey}/{task}/seed{seed}/train.log",
    benchmark:
        "benchmarks/heroes/grid/{tkey}/{task}/seed{seed}/train.tsv"
    params:
        task="{task}",
        seed="{seed}",
        model=lambda wc: {**HEROES["model"], "init": _grid.parse_train_key(wc.tkey)[1]},
        train=lambda wc: {
            **HEROES["train"],
            "padding": _grid.parse_train_key(wc.tkey)[0],
        },
        max_length=max(HEROES["ood"]["lengths"]),
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(
            "core/models",
            "core/model_files",
            "core/train",
            "heroes/scores",
            "tasks/sequences",
        ),


use rule heroes_ood as heroes_grid_ood with:
    input:
        model=f"{GRID_DIR}/train/{{tkey}}/{{task}}/seed{{seed}}/model",
    output:
        ood=f"{GRID_DIR}/train/{{tkey}}/{{task}}/seed{{seed}}/ood.json",
        batches=f"{GRID_DIR}/train/{{tkey}}/{{task}}/seed{{seed}}/ood_batches.pt",
    log:
        "logs/heroes/grid/{tkey}/{task}/seed{seed}/ood.log",
    benchmark:
        "benchmarks/heroes/grid/{tkey}/{task}/seed{seed}/ood.tsv"


rule heroes_grid_measure:
    input:
        model=grid_model_input("model"),
        ood=grid_model_input("ood.json"),
        batches=grid_model_input("ood_batches.pt"),
    output:
        components=f"{GRID_DIR}/measure/{{tkey}}/{{task}}/seed{{seed}}/components.csv",
        joint=f"{GRID_DIR}/measure/{{tkey}}/{{task}}/seed{{seed}}/joint.csv",
        sweep=f"{GRID_DIR}/measure/{{tkey}}/{{task}}/seed{{seed}}/sweep.csv",
    log:
        "logs/heroes/grid/{tkey}/{task}/seed{seed}/measure.log",
    benchmark:
        "benchmarks/heroes/grid/{tkey}/{task}/seed{seed}/measure.tsv"
    conda:
        "../../envs/selfrepair.yaml"
    threads: COMPUTE_THREADS
    resources:
        gpu=GPU_JOB,
    params:
        task="{task}",
        seed="{seed}",
        cells=grid_cells,
        n_measure=grid_n_measure,
        sweep=grid_sweep,
        sweep_normalization=GRID_BASE["g_normalization"],
        ablation=HEROES["scores"]["ablation"],
        threshold=HEROES["roles"]["threshold"],
        thresholds=HEROES["roles"]["thresholds"],
        device=DEVICE,
        numerics=NUMERICS,
        code=code_hash(
            "core/models",
            "core/model_files",
            "core/attribution",
            "core/engine",
            "heroes/scores",
            "core/components",
            "heroes/protocol",
        ),
    script:
        "../../scripts/heroes_grid_measure.py"


rule heroes_grid_tables:
    input:
        claims=PUBLISHED,
        components=grid_measured("components.csv"),
        joint=grid_measured("joint.csv"),
        sweep=grid_measured("sweep.csv"),
    output:
        seeds=f"{GRID_TABLES}/seeds.csv",
        components=f"{GRID_TABLES}/components.csv",
        rho=report(
            f"{GRID_TABLES}/rho.csv",
            caption="../report/heroes_grid.rst",
            category="Paper A (protocol grid)",
        ),
        roles_by_layer=report(
            f"{GRID_TABLES}/roles_by_layer.csv",
            caption="../report/heroes_grid.rst",
            category="Paper A (protocol grid)",
        ),
        superadditivity=report(
            f"{GRID_TABLES}/superadditivity.csv",
            caption="../report/heroes_grid.rst",
            category="Paper A (protocol grid)",
        ),
        noise=report(
            f"{GRID_TABLES}/noise.csv",
            caption="../report/heroes_grid.rst",
            category="Paper A (protocol grid)",
        ),
        claims=report(
            f"{GRID_TABLES}/claims.csv",
            caption="../report/heroes_grid.rst",
            category="Paper A (protocol grid)",
        ),
        paired=report(
            f"{GRID_TABLES}/paired.csv",
            caption="../report/heroes_grid.rst",
            category="Paper A (protocol grid)",
        ),
    log:
        "logs/heroes/grid/tables.log",
    localrule: True
    conda:
        "../../envs/selfrepair.yaml"
    params:
        protocols={c: _grid.describe(p) for c, p in GRID_PROTO.items()},
        threshold=HEROES["roles"]["threshold"],
        thresholds=HEROES["roles"]["thresholds"],
        n_boot=GRID["n_boot"],
        code=code_hash(
            "heroes/grid_tables",
            "heroes/claims",
            "heroes/grid_claims",
            "heroes/grid",
            "core/analysis",
            "core/published",
            "heroes/spread",
        ),
    script:
        "../../scripts/heroes_grid_tables.py"


for _fig, _tables in GRID_FIGURES.items():

    rule:
        name:
            f"heroes_grid_fig_{_fig}"
        input:
            **{t: f"{GRID_TABLES}/{t}.csv" for t in _tables},
        output:
            report(
                f"{GRID_FIGS}/{_fig}.png",
                caption=f"../report/heroes_grid_{_fig}.rst",
                category="Paper A (protocol grid)",
            ),
            f"{GRID_FIGS}/{_fig}.pdf",
        log:
            f"logs/heroes/grid/fig_{_fig}.log",
        localrule: True
        conda:
            "../../envs/selfrepair.yaml"
        params:
            figure=_fig,
            code=code_hash("heroes/grid_plots", "core/plots"),
        script:
            "../../scripts/heroes_grid_figure.py"
