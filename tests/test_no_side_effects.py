"""No library call leaves a lasting change on the caller's model.

Every public entry point of selfrepair.gim and selfrepair.coax that takes a bridge is
called on a tiny GPT-2 bridge whose parameters require gradients (as a user's model
does); afterwards every parameter's ``requires_grad`` and ``.grad``, every hook point's
and module's hooks, every patched ``forward``, the ``cfg`` flags, the training mode and
``F.softmax`` must be what they were.
"""

import warnings

import pytest
import torch
import torch.nn.functional as F

warnings.filterwarnings("ignore")

from selfrepair.coax import baselines, pruning  # noqa: E402
from selfrepair.coax import score as coax  # noqa: E402
from selfrepair.coax.induction_experiment import induction_scores  # noqa: E402
from selfrepair.coax.ioi_experiment import ablation_drops, ground_truth  # noqa: E402
from selfrepair.core.components import Component, head_components  # noqa: E402
from selfrepair.core.models import build_gpt2_toy, gpt2_toy_config, load_bridge, save_model  # noqa: E402
from selfrepair.gim import backward as B  # noqa: E402
from selfrepair.gim import feature_attribution as FA  # noqa: E402
from selfrepair.gim.attribute import (  # noqa: E402
    METHODS,
    edge_scores,
    exact_edge_patching,
    information_flow_routes,
    per_edge_patching,
    speed,
)
from selfrepair.gim.evaluate import faithfulness_curve, patched, run_circuit  # noqa: E402
from selfrepair.gim.graph import Graph, top_edges  # noqa: E402
from selfrepair.gim.hooks import forward_activations  # noqa: E402
from selfrepair.gim.localization import localize  # noqa: E402
from selfrepair.gim.selfrepair_attention import attention_selfrepair, patterns  # noqa: E402
from selfrepair.tasks import ioi  # noqa: E402
from selfrepair.tasks.counterfactual import CounterfactualBatch, save_word_tokenizer  # noqa: E402

V = ioi.VOCAB


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    folder = tmp_path_factory.mktemp("side") / "m"
    cfg = gpt2_toy_config(vocab_size=V, n_layers=2, n_heads=2, d_model=16, d_mlp=32, n_ctx=16)
    save_model(build_gpt2_toy(cfg, seed=3, positional=True), folder)
    save_word_tokenizer(folder, ioi.VOCAB_WORDS)
    b = load_bridge(folder, "cpu")
    for p in b.parameters():
        p.requires_grad_(True)  # a user's model, ready for their own gradients
    # TransformerLens wires its own capture pre-hooks on a block's first forward, and
    # transformers its output-capturing hooks on the first cached run; both are installed
    # once, by them, whatever the caller does: the reference state is taken after them
    with torch.no_grad():
        b.run_with_cache(torch.ones(1, 4, dtype=torch.long))
    return b


def _modules(b):
    mods = list(b.modules())
    orig = getattr(b, "original_model", None)
    if isinstance(orig, torch.nn.Module):
        mods += list(orig.modules())
    return mods


def state(b) -> dict:
    cfg = {k: v for k, v in vars(b.cfg).items() if isinstance(v, (bool, int, float, str, type(None)))}
    return {
        "requires_grad": [p.requires_grad for p in b.parameters()],
        "grad": [p.grad is None for p in b.parameters()],
        "hook_points": {n: (len(hp.fwd_hooks), len(hp.bwd_hooks)) for n, hp in b.hook_dict.items()},
        "module_hooks": [
            (
                len(m._forward_hooks),
                len(m._forward_pre_hooks),
                len(m._backward_hooks),
                len(m._backward_pre_hooks),
                "forward" in m.__dict__,
            )
            for m in _modules(b)
        ],
        "cfg": cfg,
        "training": b.training,
        "softmax": F.softmax,
    }


def _cf(n=4, T=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return CounterfactualBatch(
        torch.randint(1, V, (n, T), generator=g),
        torch.randint(1, V, (n, T), generator=g),
        torch.randint(1, V, (n,), generator=g),
        torch.randint(1, V, (n,), generator=g),
        torch.full((n,), T - 1),
    )


def _gim_calls(b):
    data = _cf()
    graph = Graph.from_bridge(b)
    s = torch.randn(graph.valid.shape, generator=torch.Generator().manual_seed(0)) * graph.valid
    half = top_edges(graph, s, graph.n_edges // 2, absolute=True)
    tokens, pos, target = data.clean[:1], int(data.pos[0]), int(data.answer[0])
    truth = torch.zeros_like(data.clean[:2], dtype=torch.bool)
    truth[:, 2] = True

    def patched_run():
        _, a_corr = forward_activations(b, graph, data.corrupt)
        with patched(b, graph, half, a_corr):
            b(data.clean)

    def with_gim(name):
        def run():
            with B.gim(b, B.GIMConfig.variant(name)):  # the caller's gradient (autograd.grad: no .grad)
                torch.autograd.grad(b(data.clean)[:, -1, 1].sum(), [next(b.parameters())])

        return run

    return {
        "forward_activations": lambda: forward_activations(b, graph, data.clean),
        **{f"edge_scores[{m}]": (lambda m=m: edge_scores(b, graph, data, m, ig_steps=2)) for m in METHODS},
        "patched": patched_run,
        "run_circuit": lambda: run_circuit(b, graph, data, half),
        "faithfulness_curve": lambda: faithfulness_curve(b, graph, data, s, fractions=(0.1, 1.0)),
        "localize": lambda: localize(b, data, "gim", fractions=(0.1, 1.0)),
        "per_edge_patching": lambda: per_edge_patching(b, graph, _cf(n=2, T=4)),
        "exact_edge_patching": lambda: exact_edge_patching(b, graph, _cf(n=2, T=4)),
        "information_flow_routes": lambda: information_flow_routes(b, graph, _cf(n=2, T=4)),
        "speed": lambda: speed(b, _cf(n=2, T=4)),
        **{f"gim[{v}]": with_gim(v) for v in B.VARIANTS},
        **{f"attribute[{m}]": (lambda m=m: FA.attribute(b, tokens, pos, target, 0, m, ig_steps=2)) for m in FA.METHODS},
        "faithfulness_scores": lambda: FA.faithfulness_scores(b, tokens, pos, target, 0, torch.arange(8.0)),
        "fa.evaluate": lambda: FA.evaluate(b, _cf(n=2), truth, 0, ig_steps=2),
        "patterns": lambda: patterns(b, data.clean),
        "attention_selfrepair": lambda: attention_selfrepair(b, data, batch_size=8),
    }


def _coax_calls(b):
    prompts = ioi.sample_toy(6, seed=0)
    tokens = prompts.tokens
    heads = head_components(2, 2)
    metric = lambda lg: ioi.logit_diff(lg, prompts)  # noqa: E731
    support = coax.clean_support(b, tokens, "v1", 8)
    from selfrepair.tasks.lm import lm_loss

    loss = lambda lg: lm_loss(lg, tokens)  # noqa: E731
    table = coax.scan(b, tokens, heads, [heads[0]], "v1", 8).table
    return {
        "scan": lambda: coax.scan(b, tokens, heads, [heads[0]], "v1", 8),
        "single_energies": lambda: coax.single_energies(b, tokens, heads, top_r=8),
        "pairwise_synergy": lambda: coax.pairwise_synergy(b, tokens, heads[:3], support),
        "head_output_norms": lambda: coax.head_output_norms(b, tokens, heads),
        "wake_up_ratios": lambda: coax.wake_up_ratios(b, tokens, heads, [heads[0]]),
        "wake_up_curve": lambda: coax.wake_up_curve(b, tokens, [heads[0]], heads[2:]),
        "atp": lambda: baselines.atp(b, tokens, heads, metric),
        "eap_ig": lambda: baselines.eap_ig(b, tokens, heads, metric, steps=2),
        "atp_star_graddrop": lambda: baselines.atp_star_graddrop(b, tokens, heads, metric),
        "atp_mag": lambda: baselines.atp_mag(b, tokens, heads, metric),
        "cond_grad": lambda: baselines.cond_grad(b, tokens, heads, [heads[0]], metric),
        "atp_star_2s": lambda: baselines.atp_star_2s(b, tokens, heads, [heads[0]], metric),
        "all_scores": lambda: baselines.all_scores(b, tokens, heads, metric, table, ig_steps=2, primaries=[heads[0]]),
        "pruning.orders": lambda: pruning.orders(b, tokens, heads, loss, 0.5, top_r=8),
        "run_pruning": lambda: pruning.run_pruning(b, tokens, tokens, [0.0, 0.5], top_r=8),
        "ablation_drops": lambda: ablation_drops(b, prompts, [[heads[0]], [Component(1, 1)]]),
        "ground_truth": lambda: ground_truth(b, prompts, heads, n_primary=1),
        "induction_scores": lambda: induction_scores(b, tokens[:, :9], torch.full((6,), 4)),
    }


@pytest.mark.parametrize("package", ["gim", "coax"])
def test_no_call_leaves_the_model_changed(bridge, package):
    before = state(bridge)
    calls = (_gim_calls if package == "gim" else _coax_calls)(bridge)
    assert state(bridge) == before  # building the inputs changed nothing either
    for name, call in calls.items():
        call()
        after = state(bridge)
        changed = [k for k in before if after[k] != before[k]]
        assert not changed, f"{name} left {changed} changed"


def test_prepared_restores_flags_set_by_the_caller(bridge):
    """A caller's own flags (here use_attn_in on, which excludes split q/k/v inputs) survive."""
    data = _cf()
    graph = Graph.from_bridge(bridge)
    bridge.set_use_attn_in(True)
    try:
        before = state(bridge)
        edge_scores(bridge, graph, data, "eap")
        assert state(bridge) == before and bridge.cfg.use_attn_in and not bridge.cfg.use_split_qkv_input
    finally:
        bridge.set_use_attn_in(False)


def test_caller_can_still_take_gradients_after_localize(bridge):
    """The symptom this guards against: after circuits.localize a user's own backward
    still reaches the weights, the same gradients as before the call."""
    tokens = _cf().clean

    def user_grads():
        bridge(tokens)[:, -1].sum().backward()
        g = {n: p.grad.clone() for n, p in bridge.named_parameters() if p.grad is not None}
        bridge.zero_grad(set_to_none=True)
        return g

    before = user_grads()
    assert before
    localize(bridge, _cf(), "eap", fractions=(0.5, 1.0))
    after = user_grads()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[n], before[n]) for n in before)
