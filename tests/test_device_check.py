"""The device check: the rules' code on a CUDA device emulated on this CPU
(src/selfrepair/core/emulated_cuda.py), where a host tensor that meets the model's
tensors fails as it does on a GPU. Each test runs a rule's library entry point with the
model moved to ``cuda`` and host inputs as the rule's data gives them, and compares
with the same call on the CPU: the emulated device runs the CPU's kernels, so the
results are the CPU's bit for bit (only where the host and the device meet differs).

Every rule with a script is listed in ``RULES`` (end of the module): each compute rule
of the DAG (the tiny one of config/test.yaml and the real-model rules coax_real and
gim_mib) with the tests that run its entry points here, each other rule with why it needs
none (tables and figures; coax_synthetic, paper B's planted-backup benchmark, has no model
and no tensor: numpy only). test_every_rule_is_covered reads workflow/rules/*.smk as text
(no Snakemake) and fails on a rule that is not listed.

Reintroducing the three failures the first GPU run met turns it red: host tokens in
heroes_train's evaluation (heroes/scores.py ablation_correct -> core/engine.py _embed),
in gim/hooks.py forward_activations, and in MIB's edge scoring (gim/attribute.py)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from selfrepair.core import emulated_cuda as ec

warnings.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parents[1]
CKPT = ROOT / "tests" / "golden" / "checkpoints" / "results"


@pytest.fixture
def cuda():
    ec.install()
    try:
        yield
    finally:
        ec.uninstall()


# ------------------------------------------------------------- the emulation ------
def test_a_host_operand_fails_as_on_cuda(cuda):
    emb = torch.nn.Embedding(10, 4).to("cuda")
    assert emb.weight.device == torch.device("cuda", 0) and isinstance(emb.weight, torch.nn.Parameter)
    with pytest.raises(ec.DeviceMismatch, match="same device"):
        emb(torch.tensor([1, 2]))
    x = torch.zeros(3, device="cuda")
    with pytest.raises(ec.DeviceMismatch):
        x + torch.ones(3)
    with pytest.raises(ec.DeviceMismatch):
        torch.cat([x, torch.ones(3)])
    with pytest.raises(ec.DeviceMismatch, match="indices"):
        torch.arange(5)[torch.tensor([1, 2]).cuda()]  # a host tensor, device indices
    with pytest.raises(TypeError, match="numpy"):
        x.numpy()
    with pytest.raises(TypeError, match="numpy"):
        np.asarray(x)


def test_what_cuda_accepts_passes(cuda):
    x = torch.arange(6.0).cuda()
    idx = torch.tensor([0, 2])  # host indices in advanced indexing
    assert x[idx].device.type == "cuda" and x[idx].tolist() == [0.0, 2.0]
    x[idx] = 7.0
    assert (x + torch.tensor(1.0)).device.type == "cuda"  # a 0-dim host operand
    lin = torch.nn.Linear(3, 2).to("cuda")
    lin.load_state_dict(torch.nn.Linear(3, 2).state_dict())  # copy_ across devices
    host = x.cpu()
    assert host.device.type == "cpu" and host.numpy().tolist() == [7.0, 1.0, 7.0, 3.0, 4.0, 5.0]
    assert torch.zeros(2, device=x.device).device.type == "cuda" and torch.ones(2).to(x).device.type == "cuda"


def test_backward_hooks_get_device_gradients_and_training_steps(cuda):
    """Autograd hands hooks plain tensors; they arrive as device tensors, so a hook that
    mixes its gradient with the model's activations is no false alarm."""
    lin = torch.nn.Linear(4, 2).to("cuda")
    seen = []
    lin.register_full_backward_hook(lambda m, gi, go: seen.append((go[0] * lin.weight.sum()).device.type))
    inp = torch.randn(5, 4).cuda().requires_grad_(True)
    inp.register_hook(lambda g: seen.append((g * inp).device.type))
    opt = torch.optim.Adam(lin.parameters(), lr=0.1)
    before = lin.weight.detach().cpu().clone()
    lin(inp).pow(2).sum().backward()
    opt.step()
    assert seen == ["cuda", "cuda"] and lin.weight.grad.device.type == "cuda"
    assert not torch.equal(lin.weight.detach().cpu(), before)


def test_the_rules_resolve_cuda_to_the_emulation(monkeypatch):
    from selfrepair.core.device import resolve_device

    monkeypatch.setenv(ec.ENV, "1")
    try:
        assert resolve_device("cuda") == "cuda" and ec.installed()
        assert resolve_device("auto") == "cpu"
    finally:
        ec.uninstall()


# ------------------------------------------------------------- paper A ------------
def _heroes_model(task="sort", seed=42):
    from selfrepair.core.models import load_hf

    return load_hf(CKPT / "heroes" / task / f"seed{seed}" / "model")


def test_heroes_train_evaluation_on_cuda(cuda):
    """heroes_train's eval_fn (id_accuracy: both paddings) with the eval set on the host."""
    from selfrepair.heroes import scores

    model = _heroes_model()
    host = [scores.id_accuracy(model, "sort", 3, 5, 20, 7, padding=p) for p in ("per_batch", "per_example")]
    model.to("cuda")
    on_cuda = [scores.id_accuracy(model, "sort", 3, 5, 20, 7, padding=p) for p in ("per_batch", "per_example")]
    assert on_cuda == host


def test_heroes_scoring_paths_on_cuda(cuda):
    """heroes_scores / heroes_ood / heroes_probe: ablation curves, means, attention
    patterns and OOD accuracies with host batches."""
    from selfrepair.core import engine
    from selfrepair.core.components import parse
    from selfrepair.heroes import scores
    from selfrepair.tasks import sequences as S

    model = _heroes_model("reverse", 42)
    batch = S.eval_set("reverse", 4, 16, 3)
    sets = [[], [parse("L0H0")], [parse("L0H0"), parse("L0MLP")]]

    def run():
        means = engine.means(model, [batch.tokens])
        return (
            scores.ablation_correct(model, batch, sets).cpu(),
            scores.ablation_correct(model, batch, sets, mode="mean", means=means).cpu(),
            [p.cpu() for p in engine.AblationEngine(model).attention_patterns(batch.tokens)],
            scores.ood_accuracies(model, "reverse", [5, 6], 8, 1),
        )

    host = run()
    model.to("cuda")
    dev = run()
    assert torch.equal(dev[0], host[0]) and torch.equal(dev[1], host[1])
    assert all(torch.equal(a, b) for a, b in zip(dev[2], host[2])) and dev[3] == host[3]


def test_training_loop_on_cuda(cuda):
    """core/train.py's loop (every training rule: heroes_train, heroes_grid_train,
    gim_train, coax_*_train) with host batches and heroes_train's evaluation."""
    from selfrepair.core.train import train
    from selfrepair.heroes import scores
    from selfrepair.tasks import sequences as S

    def batch_fn(step):
        return S.make_padded_batch("sort", [3, 4, 5, 4], torch.Generator().manual_seed(step))

    def run(device):
        model = _heroes_model()
        res = train(model, batch_fn, lambda m: scores.id_accuracy(m, "sort", 3, 4, 8, 1), lr=1e-3, max_steps=3,
                    eval_every=3, target_accuracy=None, device=device, progress_seconds=None)  # fmt: skip
        return res, {k: v.detach().cpu() for k, v in model.state_dict().items()}

    ec.uninstall()
    host, host_w = run("cpu")
    ec.install()
    dev, dev_w = run("cuda")
    assert all(torch.equal(dev_w[k], host_w[k]) for k in host_w)
    assert dev.steps == host.steps


def test_heroes_gradients_on_cuda(cuda):
    """heroes_scores' gradient norms and heroes_probe's attention statistics."""
    from selfrepair.core import attribution, engine
    from selfrepair.core.components import all_components
    from selfrepair.heroes import scores
    from selfrepair.tasks import sequences as S

    model = _heroes_model()
    comps = all_components(model.config.n_layer, model.config.n_head)
    batches = [S.eval_set("sort", 4, 8, s) for s in (1, 2)]

    def run(device):
        norms = attribution.gradient_norms_gpt2(model, [b.to(device) for b in batches], comps, scores.lm_loss, "sqrt")
        pats = engine.AblationEngine(model).attention_patterns(batches[0].tokens.to(device))
        return norms, scores.attention_stats(pats), scores.mean_attention_pattern(pats, 0, 1)

    host = run("cpu")
    model.to("cuda")
    dev = run("cuda")
    assert {k: list(v) for k, v in dev[0].items()} == {k: list(v) for k, v in host[0].items()}
    assert dev[1].equals(host[1]) and np.array_equal(dev[2], host[2])


# ------------------------------------------------------------- paper C ------------
def _gim_bridge(device):
    from selfrepair.core.models import load_bridge

    return load_bridge(CKPT / "gim" / "arithmetic" / "tiny" / "seed0" / "model", device)


def test_gim_train_accuracy_on_cuda(cuda):
    from selfrepair.core.models import load_hf
    from selfrepair.gim import training

    model = load_hf(CKPT / "gim" / "arithmetic" / "tiny" / "seed0" / "model")
    data = _arith_data(model)
    host = training.accuracy(model, data)
    model.to("cuda")
    assert training.accuracy(model, data) == host


def _arith_data(model, n=8):
    """Counterfactual pairs of the checkpoint's vocabulary, on the host."""
    from selfrepair.tasks.counterfactual import CounterfactualBatch

    g = torch.Generator().manual_seed(0)
    v = model.config.vocab_size
    clean = torch.randint(0, v, (n, 5), generator=g)
    corrupt = torch.randint(0, v, (n, 5), generator=g)
    return CounterfactualBatch(
        clean, corrupt, torch.randint(0, v, (n,), generator=g), torch.randint(0, v, (n,), generator=g),
        torch.full((n,), 4),
    )  # fmt: skip


def test_gim_forward_activations_with_host_tokens(cuda):
    from selfrepair.gim.graph import Graph
    from selfrepair.gim.hooks import forward_activations

    host_bridge = _gim_bridge("cpu")
    data = _arith_data(host_bridge)
    graph = Graph.from_bridge(host_bridge)
    logits_h, acts_h = forward_activations(host_bridge, graph, data.clean)
    bridge = _gim_bridge("cuda")
    logits, acts = forward_activations(bridge, graph, data.clean)
    assert logits.device.type == "cuda"
    assert torch.equal(logits.cpu(), logits_h) and torch.equal(acts.cpu(), acts_h)


def test_gim_selfrepair_speed_and_fa_on_cuda(cuda):
    """gim_selfrepair, gim_speed (arithmetic toy) and gim_fa (classify toy) with the
    task's host data."""
    from selfrepair.core.models import load_bridge
    from selfrepair.gim import feature_attribution as fa
    from selfrepair.gim.attribute import speed
    from selfrepair.gim.selfrepair_attention import attention_selfrepair
    from selfrepair.tasks.registry import get_task

    arith, classify = get_task("arithmetic"), get_task("classify")
    data = arith.sample(6, seed=3)
    fa_data, truth = classify.sample_with_truth(2, seed=4)
    fa_model = CKPT / "gim" / "classify" / "tiny" / "seed0" / "model"

    def run(device):
        bridge = _gim_bridge(device)
        per_input, rows = attention_selfrepair(bridge, data, 0.1)
        sp = speed(bridge, data, 4)
        df = fa.evaluate(load_bridge(fa_model, device), fa_data, truth, classify.id["<pad>"], ig_steps=2)
        return per_input, rows, sp, df

    ec.uninstall()
    host = run("cpu")
    ec.install()
    dev = run("cuda")
    assert dev[0].equals(host[0]) and dev[1].equals(host[1]) and dev[3].equals(host[3])
    assert {k: v for k, v in dev[2].items() if not k.endswith("_s")}.keys() == host[2].keys() - {
        k for k in host[2] if k.endswith("_s")
    }


METHODS = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["gim"]["methods"]


@pytest.fixture(scope="module")
def mib_stand_in(tmp_path_factory):
    """A random-weight GPT-2 and Llama stand-in and a MIB IOI dataset (test_gim_mib's)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import test_gim_mib as tgm

    root = tmp_path_factory.mktemp("mib")
    paths = tgm._models(root / "models")
    tgm._datasets(root / "data")
    return paths, str(root / "data")


def test_mib_every_method_on_cuda(cuda, mib_stand_in):
    """gim_mib's entry point (run_mib) for every method of gim.methods, GPT-2 and Llama
    stand-ins: every pair runs (a device error would make a 'not run' row) and scores as
    on the CPU."""
    from selfrepair.gim.localization import run_mib

    paths, data = mib_stand_in
    models = [paths["gpt2"], paths["llama"]]
    # a set budget: the emulated device has no free memory to ask torch.cuda for
    kw = dict(n_eval=4, search_paths=[data], batch_size=4, ig_steps=2, fractions=(0.5, 1.0), memory_gb=64.0)
    ec.uninstall()
    _, host, _ = run_mib(models, ["ioi"], METHODS, device="cpu", **kw)
    ec.install()
    status, table, _ = run_mib(models, ["ioi"], METHODS, device="cuda", **kw)
    assert (status.status == "ran").all(), status.reason.tolist()
    assert set(table.method) == set(METHODS) == set(host.method) and len(table) == len(host) == 2 * len(METHODS)
    cols = ["cpr", "cmd"]
    assert np.allclose(table[cols].to_numpy(float), host[cols].to_numpy(float), equal_nan=True)


# ------------------------------------------------------------- paper B ------------
from test_coax_tasks import tiny_real_models  # noqa: E402,F401  (random-weight GPT-2, NeoX, Llama)


def test_coax_real_on_cuda(cuda, tiny_real_models, tmp_path):  # noqa: F811
    """coax_real's entry point (run_real_models): IOI, wake-up and induction on the
    random-weight stand-ins; every part runs, with the CPU's tables."""
    import pandas as pd

    from selfrepair.coax import real_models

    real = {
        "search_paths": [str(tiny_real_models)], "ioi_model": "tiny-gpt2", "wakeup_models": ["tiny-llama"],
        "induction_models": ["tiny-neox"], "n_prompts": 8, "data_seeds": [1], "induction_T": 6,
    }  # fmt: skip
    ioi_cfg = {"n_primary": 2, "backup_frac": 0.2, "top_k": 5, "k_recovered": None, "wake_min": 1.05, "ig_steps": 2,
               "amp_eps": 1e-3}  # fmt: skip
    ind_cfg = {"n_prompts": 6, "data_seed": 3, "ks": [2], "n_primary": 2, "n_random": 2, "protocol": "v1"}
    ec.uninstall()
    real_models.run_real_models(real, ioi_cfg, ind_cfg, "v2", 8, tmp_path / "cpu", "cpu")
    ec.install()
    status = real_models.run_real_models(real, ioi_cfg, ind_cfg, "v2", 8, tmp_path / "cuda", "cuda")
    ran = status[status.experiment != "pruning"]
    assert (ran.status == "ran").all(), ran.reason.tolist()
    for f in sorted((tmp_path / "cpu").glob("*.csv")):
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "cuda" / f.name), pd.read_csv(f), check_exact=False)


def test_coax_pruning_on_cuda(cuda):
    """coax_pruning's entry point (run_pruning) on the golden pruning LM, its inputs moved
    as the rule moves them."""
    from selfrepair.coax import pruning
    from selfrepair.core.models import load_bridge
    from selfrepair.tasks import lm

    calib, evalset = lm.sample(4, 24, 80_000), lm.sample(8, 24, 90_000)

    def run(device):
        bridge = load_bridge(CKPT / "coax" / "pruning" / "model", device)
        return pruning.run_pruning(bridge, calib.to(device), evalset.to(device), [0.0, 0.5], 0, "v1", 16, 2048)[0]

    ec.uninstall()
    host = run("cpu")
    ec.install()
    assert run("cuda").equals(host)


def test_heroes_grid_measure_at_the_authors_site_on_cuda(cuda):
    """heroes_grid_measure: raw gradient norms, the means, and the ablations at the
    authors' site (attn_out_slice; hook_z is test_heroes_scoring_paths_on_cuda's), mean
    and zero, with the batches moved as the rule moves them."""
    from selfrepair.core import attribution, engine
    from selfrepair.core.components import all_components
    from selfrepair.heroes import scores
    from selfrepair.tasks import sequences as S

    model = _heroes_model("reverse", 42)
    comps = all_components(model.config.n_layer, model.config.n_head)
    batches = [S.eval_set("reverse", 4, 8, s) for s in (1, 2)]
    fresh = S.eval_set("reverse", 4, 12, 3)
    sets = [[]] + [[c] for c in comps] + [comps[:2]]

    def run(device):
        bs = [b.to(device) for b in batches]
        raw = attribution.gradient_norms_gpt2(model, bs, comps, scores.lm_loss, "raw")
        means = engine.means(model, [b.tokens for b in bs], comps)
        f = fresh.to(device)
        return raw, [
            scores.ablation_correct(model, f, sets, m, means, site="attn_out_slice").cpu() for m in ("mean", "zero")
        ]

    host = run("cpu")
    model.to("cuda")
    dev = run("cuda")
    assert {k: list(v) for k, v in dev[0].items()} == {k: list(v) for k, v in host[0].items()}
    assert all(torch.equal(a, b) for a, b in zip(dev[1], host[1]))


# ------------------------------------------------------------- ground truth -------
GT = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["groundtruth"]


def _groundtruth_tables(family: str, model_dir: Path, device: str) -> dict:
    """scripts/groundtruth_model.py's computation for one model of ``family``: its
    evaluation batch built and moved as the script's ``inputs`` does (a few examples),
    the component means and pipeline.model_tables with the Hugging Face model."""
    from selfrepair.core import components as C
    from selfrepair.core import interventions, models
    from selfrepair.gim import evaluate
    from selfrepair.groundtruth import games, pipeline
    from selfrepair.tasks import ioi
    from selfrepair.tasks import sequences as S
    from selfrepair.tasks.registry import get_task

    if family == "heroes":
        fresh = S.eval_set("sort", 4, 6, 37)  # heroes_ood's fresh set, as ood_batches.pt holds it
        batch = S.Batch(fresh.tokens, fresh.targets, fresh.mask).to(device)
        tokens, specs = batch.tokens, pipeline.heroes_specs(batch, GT["heroes"]["games"])
    elif family == "ioi":
        prompts = ioi.sample_toy(6, 5).to(device)
        spec = pipeline.GameSpec("logit_diff", lambda lg: ioi.logit_diff(lg, prompts), engine=games.ioi_reduce(prompts))
        tokens, specs = prompts.tokens, [spec]
    else:
        cf = get_task("arithmetic").sample(4, seed=0)
        cf = type(cf)(*(t.to(device) for t in (cf.clean, cf.corrupt, cf.answer, cf.foil, cf.pos)))
        spec = pipeline.GameSpec(
            "logit_diff", lambda lg: evaluate.logit_diff(lg, cf).mean(), engine=games.counterfactual_reduce(cf)
        )
        tokens, specs = cf.clean, [spec]
    bridge = models.load_bridge(model_dir, device)
    comps = C.all_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
    means = interventions.component_means(bridge, [tokens], comps)
    keys = ("exact_max_players", "max_permutations", "min_pairs", "rel_se", "pairs_per_round", "seed", "max_rows")
    settings = pipeline.Settings(
        mode=GT[family]["mode"], ig_steps=2, n_primary=2, **{k: GT[k] for k in keys if k in GT}
    )
    hf = models.load_hf(model_dir, device)
    tables = pipeline.model_tables(bridge, tokens, specs, comps, means, settings, hf_model=hf)
    return {k: tables[k] for k in ("shapley", "interactions", "scores")}


@pytest.mark.parametrize(
    "family, model",
    [
        ("heroes", "heroes/sort/seed42/model"),
        ("ioi", "coax/ioi/seed1/model"),
        ("gim", "gim/arithmetic/tiny/seed0/model"),
    ],
)
def test_groundtruth_on_cuda(cuda, family, model):
    """groundtruth_heroes, groundtruth_ioi, groundtruth_gim: Shapley values, interactions
    and every method's scores, equal to the CPU's."""
    ec.uninstall()
    host = _groundtruth_tables(family, CKPT / model, "cpu")
    ec.install()
    dev = _groundtruth_tables(family, CKPT / model, "cuda")
    for name, table in host.items():
        assert len(table) > 0 and dev[name].equals(table), name


# ------------------------------------------------------------- paper B (toys) -----
def test_coax_ioi_truth_on_cuda(cuda):
    """coax_ioi_truth's entry point (ioi_experiment.ground_truth): every single and pair
    ablation of the toy IOI model, its prompts moved as the rule moves them."""
    from selfrepair.coax import ioi_experiment
    from selfrepair.core.components import head_components
    from selfrepair.core.models import load_bridge
    from selfrepair.tasks import ioi

    prompts = ioi.sample_toy(8, 7)

    def run(device):
        bridge = load_bridge(CKPT / "coax" / "ioi" / "seed1" / "model", device)
        heads = head_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
        return ioi_experiment.ground_truth(bridge, prompts.to(device), heads, 2, 0.2, 2048)

    ec.uninstall()
    host = run("cpu")
    ec.install()
    dev = run("cuda")
    assert dev[0].equals(host[0]) and dev[1].equals(host[1]) and len(host[1]) > 0
    assert [h.name for h in dev[2]] == [h.name for h in host[2]] and [h.name for h in dev[3]] == [
        h.name for h in host[3]
    ]


def test_coax_toy_runs_on_cuda(cuda):
    """coax_ioi_run (run_ioi: COAX and the baselines, wake-up, freezing, knockout) on the
    toy IOI model, seeded by its ground truth, and coax_induction_run (run_induction) on
    the toy induction model; every table equal to the CPU's."""
    import pandas as pd

    from selfrepair.coax import induction_experiment, ioi_experiment
    from selfrepair.core.components import head_components
    from selfrepair.core.models import load_bridge
    from selfrepair.tasks import ioi

    prompts = ioi.sample_toy(8, 11)

    def run(device):
        bridge = load_bridge(CKPT / "coax" / "ioi" / "seed1" / "model", device)
        heads = head_components(bridge.cfg.n_layers, bridge.cfg.n_heads)
        p = prompts.to(device)
        _, _, primaries, backups = ioi_experiment.ground_truth(bridge, p, heads, 2, 0.05, 2048)
        assert primaries and backups  # (three backups here: the discovery scores have positives)
        res = ioi_experiment.run_ioi(bridge, p, heads, primaries, backups, "v2", 192, 5, None, 1.05, 2, 2048)
        ind = load_bridge(CKPT / "coax" / "induction" / "t1" / "model", device)
        res_ind = induction_experiment.run_induction(ind, (5, 8), 16, 8, 3, [2], 2, 2, "v1", 192, 2048)
        return res, res_ind

    ec.uninstall()
    host = run("cpu")
    ec.install()
    dev = run("cuda")
    for h, d in zip(host, dev):
        assert h.keys() == d.keys()
        for k, v in h.items():
            if isinstance(v, pd.DataFrame):
                assert len(v) > 0 and d[k].equals(v), k
            else:
                assert d[k] == v, k


def test_coax_training_on_cuda(cuda):
    """coax_ioi_train (train_toy: head dropout), coax_induction_train and coax_lm_train:
    two steps of each with its own data and evaluation, weights equal to the CPU's."""
    from selfrepair.coax import induction_experiment, ioi_experiment, lm_training

    runs = {
        "ioi": lambda d: ioi_experiment.train_toy(2, 4, 32, 64, seed=1, batch_size=8, max_steps=2, eval_every=2, device=d),
        "induction": lambda d: induction_experiment.train_model(
            2, 4, 32, 1, T=(5, 8), vocab=16, batch_size=8, max_steps=2, eval_every=2, device=d
        ),
        "lm": lambda d: lm_training.train_model(
            2, 4, 32, 64, 0, n_ctx=24, batch_size=4, max_steps=2, eval_every=2, device=d
        ),
    }  # fmt: skip

    def run(device):
        out = {}
        for name, fn in runs.items():
            model, res = fn(device)
            out[name] = (res.steps, res.final_accuracy, {k: v.detach().cpu() for k, v in model.state_dict().items()})
        return out

    ec.uninstall()
    host = run("cpu")
    ec.install()
    dev = run("cuda")
    for name, (steps, acc, weights) in host.items():
        assert dev[name][:2] == (steps, acc), name
        assert dev[name][2].keys() == weights.keys() and all(
            torch.equal(dev[name][2][k], w) for k, w in weights.items()
        )


# ------------------------------------------------------------- own models -------
OWN_SETTINGS = {
    "search_paths": [], "n_eval": 4, "data_seed": 0, "mode": "mean", "n_primary": 2, "protocol": "v2",
    "methods": ["eap", "gim", "eactp", "ifr"], "batch_size": 4, "fractions": [0.1, 0.5, 1.0], "ig_steps": 2,
    "weighting": "example", "tie_orders": 2, "eactp_max_edges": 5000, "circuit_fraction": 0.2, "top_k": 3,
    "single_frac": 0.1, "top_r": 192, "max_rows": 2048, "length": 3, "n_batches": 2, "role_threshold": 2,
    "settings": {"exact_max_players": 12, "max_permutations": 64, "min_pairs": 32, "n_primary": 2, "ig_steps": 2},
}  # fmt: skip


def test_own_analyses_on_cuda(cuda, tmp_path):
    """own_edges, own_shapley, own_coax, own_g_vs_c (selfrepair.own.run.run_analysis, a
    dataset file's pairs moved as the rule moves them): every table equal to the CPU's."""
    import json

    from selfrepair.core.models import build_gpt2_toy, gpt2_toy_config, save_model
    from selfrepair.own.entries import TABLES
    from selfrepair.own.run import run_analysis
    from selfrepair.tasks import sequences as S
    from tiny_models import save_toy_gpt2

    save_toy_gpt2(tmp_path / "gpt2", vocab_size=20, n_ctx=16)
    save_model(build_gpt2_toy(gpt2_toy_config(S.VOCAB, n_layers=1, n_heads=2, d_model=16, d_mlp=32)), tmp_path / "sort")
    rows = [{"clean": f"t{a} t{b} t{a}", "corrupt": f"t{b} t{b} t{a}", "answer": f"t{b}", "foil": f"t{a}"} for a, b in
            [(2, 3), (4, 5), (6, 7), (8, 9)]]  # fmt: skip
    (tmp_path / "pairs.jsonl").write_text("\n".join(json.dumps(r) for r in rows))

    def run(kind, device):
        out = tmp_path / device / kind
        out.mkdir(parents=True)
        files = {t: out / f"{t}.csv" for t in (*TABLES[kind], "status")} | {"circuits": out / "circuits"}
        model, task = ("sort", "sort") if kind == "g_vs_c" else ("gpt2", str(tmp_path / "pairs.jsonl"))
        s = {**OWN_SETTINGS, "name": kind, "model": str(tmp_path / model), "task": task}
        status = run_analysis(kind, s, files, device).iloc[0]
        assert status["status"] == "ran", (device, status["reason"])
        return {f.name: f.read_text() for f in sorted(out.rglob("*.*")) if f.name != "status.csv"}

    for kind in TABLES:
        ec.uninstall()
        host = run(kind, "cpu")
        ec.install()
        dev = run(kind, "cuda")
        assert host and dev == host, kind


# ------------------------------------------------------------- the packaged real LMs --
def _tiny_lm_with_data(root, seed: int = 0):
    """A tiny random Llama (weights of ``seed``) with a word-level tokenizer over paper C's
    real-LM datasets, written under ``root`` (``lm/``, ``data/``), as the real-LM rules
    read them."""
    from selfrepair.core.models import save_model
    from selfrepair.tasks import ioi, mib_synth
    from test_gim_lm import _all_texts, _word_tokenizer
    from tiny_models import tiny_llama

    mib_synth.write(root / "data", mib_synth.TASKS, 8, 0)
    extra = [" ".join(ioi.NAMES + ioi.PLACES + ioi.OBJECTS) + " When and went to the , gave a"]
    tok = _word_tokenizer(root / "lm", _all_texts(root / "data") + extra, bos=False)
    save_model(tiny_llama(vocab_size=len(tok), max_position_embeddings=128, seed=seed), root / "lm")
    return root / "lm", root / "data"


def test_coax_lm_on_cuda(cuda, tmp_path):
    """coax_lm's entry point (coax.lms.coax_lm): BOS choice, IOI, induction on a tiny
    random Llama, the CPU's tables on the emulated device."""
    import pandas as pd

    from selfrepair.coax import lms
    from test_coax_lms import IND_CFG, IOI_CFG, SMOKE

    # seed 1: each seeding's earliest primary in layer 0, so layer 1 holds backup
    # candidates (seed 0's name movers are both in the last layer: IOI not run, rightly)
    folder, _ = _tiny_lm_with_data(tmp_path, seed=1)
    ec.uninstall()
    lms.coax_lm(folder, "tiny", SMOKE, IOI_CFG, IND_CFG, "v2", tmp_path / "cpu", "cpu")
    ec.install()
    status = lms.coax_lm(folder, "tiny", SMOKE, IOI_CFG, IND_CFG, "v2", tmp_path / "cuda", "cuda")
    assert (status.set_index("experiment").loc[["bos", "ioi", "induction"], "status"] == "ran").all(), status.reason
    for f in sorted((tmp_path / "cpu").glob("ioi_*.csv")):
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "cuda" / f.name), pd.read_csv(f), check_exact=False)


def test_coax_lm_pruning_on_cuda(cuda, tmp_path):
    """coax_lm_pruning's entry point (coax.lm_pruning.coax_lm_pruning): the plays' windows,
    every method's order and the perplexity sweep on a tiny random Llama, the CPU's tables
    on the emulated device."""
    import pandas as pd

    from selfrepair.coax import lm_pruning

    folder, _ = _tiny_lm_with_data(tmp_path)
    s = {"sparsities": [0.0, 0.25, 0.5], "headline": 0.5, "calibration": "othello", "evaluation": "hamlet",
         "n_calib": 2, "n_eval": 3, "length": 12, "stride": 3, "seed": 0}  # fmt: skip
    ec.uninstall()
    host = lm_pruning.coax_lm_pruning(folder, "tiny", s, 8, 64, "cpu")
    ec.install()
    dev = lm_pruning.coax_lm_pruning(folder, "tiny", s, 8, 64, "cuda")
    assert dev["status"]["status"].tolist() == ["ran"]
    for name in ("perplexity", "sequences", "orders"):
        pd.testing.assert_frame_equal(dev[name], host[name], check_exact=False)


def test_gim_lm_on_cuda(cuda, tmp_path):
    """gim_lm's entry point (gim.lm_run.run_lm): the gate, EAP and GIM with their curves,
    contrasts and feature attribution, the CPU's tables on the emulated device."""
    import pandas as pd

    from selfrepair.gim.lm_run import run_lm
    from test_gim_lm import SMOKE

    folder, data = _tiny_lm_with_data(tmp_path)
    ec.uninstall()
    host = run_lm(folder, "tiny", data, SMOKE, "cpu")
    ec.install()
    dev = run_lm(folder, "tiny", data, SMOKE, "cuda")
    assert (dev["status"]["status"] != "failed").all(), dev["status"].reason.tolist()
    for k in ("tasks", "localization", "contrasts", "feature_attribution"):
        drop = [c for c in host[k].columns if c.endswith("cpu_s")]
        pd.testing.assert_frame_equal(dev[k].drop(columns=drop), host[k].drop(columns=drop), check_exact=False)


def test_groundtruth_lm_on_cuda(cuda, tmp_path):
    """groundtruth_lm's entry point (groundtruth.lms.run_lm): the top components' Shapley
    values and every method on the real-LM IOI pairs, the CPU's on the emulated device."""
    import pandas as pd

    from selfrepair.groundtruth.lms import run_lm

    folder, data = _tiny_lm_with_data(tmp_path)
    lm = {"n_pairs": 4, "mode": "mean", "players": "top", "n_players": 3, "rest": "player"}
    settings = {"max_permutations": 8, "min_pairs": 2, "ig_steps": 2}
    ec.uninstall()
    host = run_lm(folder, data, "tiny", lm, settings, 3, "cpu")
    ec.install()
    dev = run_lm(folder, data, "tiny", lm, settings, 3, "cuda")
    assert len(host["shapley"]) == 4  # 3 components and the rest
    for k in ("shapley", "scores"):
        pd.testing.assert_frame_equal(dev[k], host[k], check_exact=False)


# ------------------------------------------------------------- coverage -----------
# Every rule with a script (workflow/rules/*.smk), the compute rules mapped to the tests
# above that run their library entry points on the emulated device, the others to why
# they need none. A new rule fails test_every_rule_is_covered until it is entered here.
NO_MODEL = "no model: reads tables, writes tables or figures"
RULES = {
    "heroes_train": ("test_heroes_train_evaluation_on_cuda", "test_training_loop_on_cuda"),
    "heroes_grid_train": ("test_heroes_train_evaluation_on_cuda", "test_training_loop_on_cuda"),
    "heroes_ood": ("test_heroes_scoring_paths_on_cuda",),
    "heroes_grid_ood": ("test_heroes_scoring_paths_on_cuda",),
    "heroes_scores": ("test_heroes_scoring_paths_on_cuda", "test_heroes_gradients_on_cuda"),
    "heroes_probe": ("test_heroes_scoring_paths_on_cuda", "test_heroes_gradients_on_cuda"),
    "heroes_grid_measure": (
        "test_heroes_scoring_paths_on_cuda",
        "test_heroes_grid_measure_at_the_authors_site_on_cuda",
    ),  # fmt: skip
    "gim_train": ("test_gim_train_accuracy_on_cuda", "test_training_loop_on_cuda"),
    "gim_localize": ("test_gim_forward_activations_with_host_tokens", "test_mib_every_method_on_cuda"),
    "gim_selfrepair": ("test_gim_selfrepair_speed_and_fa_on_cuda",),
    "gim_speed": ("test_gim_selfrepair_speed_and_fa_on_cuda",),
    "gim_fa": ("test_gim_selfrepair_speed_and_fa_on_cuda",),
    "gim_mib": ("test_mib_every_method_on_cuda",),
    "coax_ioi_train": ("test_coax_training_on_cuda", "test_training_loop_on_cuda"),
    "coax_induction_train": ("test_coax_training_on_cuda", "test_training_loop_on_cuda"),
    "coax_lm_train": ("test_coax_training_on_cuda", "test_training_loop_on_cuda"),
    "coax_ioi_truth": ("test_coax_ioi_truth_on_cuda",),
    "coax_ioi_run": ("test_coax_toy_runs_on_cuda", "test_coax_real_on_cuda"),
    "coax_induction_run": ("test_coax_toy_runs_on_cuda", "test_coax_real_on_cuda"),
    "coax_pruning": ("test_coax_pruning_on_cuda",),
    "coax_real": ("test_coax_real_on_cuda",),
    "groundtruth_heroes": ("test_groundtruth_on_cuda",),
    "groundtruth_ioi": ("test_groundtruth_on_cuda",),
    "groundtruth_gim": ("test_groundtruth_on_cuda",),
    "own_{_kind}": ("test_own_analyses_on_cuda",),
    "coax_lm": ("test_coax_lm_on_cuda",),
    "coax_lm_pruning": ("test_coax_lm_pruning_on_cuda",),
    "gim_lm": ("test_gim_lm_on_cuda",),
    "groundtruth_lm": ("test_groundtruth_lm_on_cuda",),
    "lm_convert": "no device: converts a GGUF file on the host (the rule's device is cpu; gguf_files.convert dequantizes and saves float32 weights)",
    "gim_lm_data": "no model: writes paper C's real-LM datasets (tasks.mib_synth)",
    "coax_synthetic": "no model: paper B's planted-backup benchmark is numpy only (coax.score.synthetic_benchmark)",
    **{
        r: NO_MODEL
        for r in (
            "heroes_roles",
            "heroes_aggregate",
            "heroes_fig_{_fig}",
            "heroes_published",
            "heroes_grid_tables",
            "heroes_grid_fig_{_fig}",
            "coax_ioi_tables",
            "coax_induction_table",
            "coax_fig",
            "coax_published",
            "gim_tables",
            "gim_faithfulness_figure",
            "gim_published",
            "gim_selfrepair_table",
            "gim_selfrepair_figure",
            "gim_fa_table",
            "groundtruth_tables",
            "groundtruth_figures",
            "published_summary",
            "own_status",
            "own_faithfulness_figure",
            "real_lms_claims",
            "real_lms_power",
            "real_lms_forest",
            "real_lms_faithfulness",
            "real_lms_roc",
        )
    },  # fmt: skip
}


def _rules_with_scripts() -> dict[str, str]:
    """{rule name: its script's file name} of workflow/rules/*.smk, read as text (no
    Snakemake): ``rule NAME:`` blocks, rules named in a ``name:`` line (a loop's f-string
    kept as written), and ``use rule A as B`` (B runs A's script)."""
    import re

    rules, uses = {}, []
    for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        name, expect_name = None, False
        for line in smk.read_text().splitlines():
            s = line.strip()
            if m := re.match(r"use rule (\w+) as (\w+)", s):
                uses.append((m[1], m[2]))
            elif m := re.match(r"rule (\w+)?\s*:", s):
                name = m[1]
            elif s == "name:":
                expect_name = True
            elif expect_name:
                name, expect_name = re.sub(r"^f?[\"']|[\"']$", "", s), False
            elif m := re.match(r"[\"'].*scripts/(\w+\.py)[\"']", s):
                assert name, f"a script before a rule's name in {smk.name}: {s}"
                rules[name] = m[1]
    for base, new in uses:
        rules[new] = rules[base]
    return rules


def test_every_rule_is_covered():
    """Each rule with a script is mapped: a compute rule to tests of this module, a rule
    without a model to the reason, and that reason is checked: its script loads no model
    and names no device."""
    import re

    rules = _rules_with_scripts()
    assert len(rules) >= 40 and "heroes_grid_ood" in rules and "heroes_fig_{_fig}" in rules
    assert not set(rules) - set(RULES), (
        f"rules without a device test or a reason here: {sorted(set(rules) - set(RULES))}"
    )
    assert not set(RULES) - set(rules), f"no such rule any more: {sorted(set(RULES) - set(rules))}"
    for rule, cover in RULES.items():
        if isinstance(cover, str):
            text = (ROOT / "scripts" / rules[rule]).read_text()
            assert not re.search(r"load_bridge|load_hf|device|torch", text), f"{rule} has a model: give it a test"
        else:
            assert cover and all(callable(globals().get(t)) for t in cover), (rule, cover)
