"""Which float kernels does this machine share with the machines whose fingerprints are
committed? The check that the numerics modes mean what they say, on any machine.

For each preset a child process starts with that preset's pins (they must be set before
torch is imported), runs a fixed list of operations on fixed inputs on one thread (the
GEMMs, linear and attention forward and backward, layer norm, GELU, softmax, cross
entropy, a long sum, exp/log/tanh) and, unless --ops-only, trains a small GPT-2 for 64
steps, then runs every kernel that training calls at the shapes it calls them (``t_``
ops: the MKL GEMMs of GPT-2's Conv1D layers, their weight and input gradients, the
lm head, attention at 40 positions with its 8-row tail blocks, MKL's vector tanh of
``gelu_new`` and sqrt of Adam; embedding and layer-norm weight gradients, an AdamW and an
Adam step). Each result is hashed (SHA-256 prefix of its float32 bytes). Two CPUs whose
hashes agree for a preset run the same bits for those kernels under it.

``--trace`` records every ATen operation of two training steps in call order, with hashes
of its inputs and outputs (the initial parameters and the data first): of the GPT-2 above
(``--target gpt2``, the format of the team's ``op_trace.py``), of paper A's own model and
training loop (``--target heroes``), or of paper B's and C's training functions run whole
for two steps (``coax``: the toy IOI model; ``gim``: the arithmetic l2h4 model).
The first 29 ops, their inputs and the GPT-2 are the team's fingerprint tool's, so that
files written by either compare. ``--compare-trace A B`` prints the first
operation whose outputs differ, and whether its inputs agreed: the kernel that makes two
machines train other bits.

On a CPU that is not an Intel one, the pinned modes run with MKL's vendor check answered
'Intel' (src/selfrepair/core/numerics.py: a one-function library preloaded before torch),
so their presets are ``<preset>+intel-dispatch`` there: by default every preset is run
both ways, which shows which kernels differ from an Intel CPU only because MKL dispatches
on the vendor. ``--mkl-intel-dispatch`` runs only the presets with the override. The
modes ``exact`` and ``fast`` name the preset as this CPU runs them (mode_preset), and a
comparison reads each file's modes as its own vendor runs them. The exact mode also
preloads a correctly rounded square root on every CPU (``+ieee-sqrt``: MKL's COMPATIBLE
square root follows the CPU's approximate rsqrtps, whose bits differ between vendors), so
it runs as ``compatible+ieee-sqrt`` on Intel and ``compatible+intel-dispatch+ieee-sqrt``
elsewhere; files written before that have no such preset, and say nothing of the mode.

    .venv/bin/python benchmarks/fingerprint.py --out mine.json            # every preset
    .venv/bin/python benchmarks/fingerprint.py --presets exact --ops-only --out mine.json
    .venv/bin/python benchmarks/fingerprint.py --compare mine.json benchmarks/fingerprints/*.json
    .venv/bin/python benchmarks/fingerprint.py --trace --preset fast --out trace.json
    .venv/bin/python benchmarks/fingerprint.py --compare-trace trace.json benchmarks/fingerprints/*-trace-gpt2-fast.json
    make fingerprint                                                      # all of these
    .venv/bin/python benchmarks/fingerprint.py --presets exact,fast --emulate sse4_2 --out lesser.json

``--emulate avx|sse4_2`` caps every library at a lesser CPU's instruction set (ATen's DEFAULT
kernels, MKL and oneDNN at AVX or SSE4.2): what a CPU without AVX2 computes under the modes'
pins, to compare with the committed files.

A comparison prints, per file and preset present in both, SAME or the ops that differ.
``benchmarks/fingerprints/`` holds the committed files, each with its CPU and provenance.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from selfrepair.core import numerics  # noqa: E402  imports no torch

FINGERPRINTS = ROOT / "benchmarks" / "fingerprints"
BASE = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # fmt: skip
# Preset names as the team's tool writes them; the project's modes are two of them.
PRESETS = {
    "avx2-strict": {**BASE, "MKL_CBWR": "AVX2,STRICT"},
    "avx2": {**BASE, "MKL_CBWR": "AVX2"},
    "auto": {**BASE, "MKL_CBWR": "AUTO"},
    "compatible": {**BASE, "MKL_CBWR": "COMPATIBLE"},
    "compatible-strict": {**BASE, "MKL_CBWR": "COMPATIBLE,STRICT"},
    "sse4_2": {**BASE, "MKL_CBWR": "SSE4_2"},
}
# The project's pinned modes as presets: the same MKL branch as these named presets.
MODE_PRESET = {"exact": "compatible", "fast": "avx2-strict"}
for _mode, _preset in MODE_PRESET.items():
    assert numerics.MODE_PINS[_mode]["MKL_CBWR"] == PRESETS[_preset]["MKL_CBWR"], _mode
# Lesser CPUs emulated on this one (--emulate): each library capped at what such a CPU has,
# over the preset's pins. ATen's kernels below AVX2 are its DEFAULT build; MKL and oneDNN
# take their own names for the instruction sets. A CPU without AVX2 runs neither mode's
# pinned kernels (numerics.can_pin): these show what its libraries then compute.
EMULATED_CPUS = {
    "avx": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "AVX", "ONEDNN_MAX_CPU_ISA": "AVX"},
    "sse4_2": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
}
# Library variables the child must not inherit from this shell (the preset sets its own).
CLEARED = ("MKL_", "ATEN_", "ONEDNN_", "OMP_", "NPY_")


def _hash(t) -> str:
    import torch

    return hashlib.sha256(t.detach().contiguous().to(torch.float32).numpy().tobytes()).hexdigest()[:16]


def kernel_ops() -> dict:
    """{op: hash} of the kernels that training and scoring use, on fixed inputs."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    out = {}
    for m, k, n in [(1600, 128, 512), (1600, 512, 128), (1600, 128, 128), (1600, 128, 64), (200, 768, 3072)]:
        a, b = r(m, k), r(k, n)
        out[f"mm_{m}x{k}x{n}"] = _hash(a @ b)
        out[f"mmT_{m}x{k}x{n}"] = _hash(a.t().contiguous().t() @ b.t().contiguous().t())
    x, w, bias = r(32, 50, 128).requires_grad_(), r(512, 128).requires_grad_(), r(512).requires_grad_()
    y = F.linear(x, w, bias)
    y.backward(r(*y.shape))
    out.update(linear_fwd=_hash(y), linear_dx=_hash(x.grad), linear_dw=_hash(w.grad), linear_db=_hash(bias.grad))
    q, k_, v = (r(32, 4, 50, 32).requires_grad_() for _ in range(3))
    o = F.scaled_dot_product_attention(q, k_, v, is_causal=True)
    o.backward(r(*o.shape))
    out.update(sdpa_fwd=_hash(o), sdpa_dq=_hash(q.grad), sdpa_dk=_hash(k_.grad), sdpa_dv=_hash(v.grad))
    z = r(32, 50, 128).requires_grad_()
    ln = F.layer_norm(z, (128,), r(128), r(128))
    ln.backward(r(*ln.shape))
    out.update(layernorm_fwd=_hash(ln), layernorm_dx=_hash(z.grad))
    z2 = r(32, 50, 512).requires_grad_()
    ge = F.gelu(z2, approximate="tanh")
    ge.backward(r(*ge.shape))
    out.update(gelu_fwd=_hash(ge), gelu_dx=_hash(z2.grad))
    lg = r(1600, 64).requires_grad_()
    tg = torch.randint(0, 64, (1600,), generator=g)
    ce = F.cross_entropy(lg, tg)
    ce.backward()
    out.update(softmax=_hash(lg.softmax(-1)), cross_entropy=_hash(ce.reshape(1)), cross_entropy_dx=_hash(lg.grad))
    out["sum_1e6"] = _hash(r(1_000_000).sum().reshape(1))
    out["exp_log_tanh"] = _hash(torch.cat([r(10000).exp(), r(10000).abs().log(), r(10000).tanh()]))
    out["_generator"] = g  # the training data continue the same stream
    return out


def train_gpt2(g) -> tuple[dict, float]:
    """A 4-layer, d_model 128 GPT-2 trained 64 steps: ({op: hash}, steps per second)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=64, n_positions=64, n_embd=128, n_layer=4, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="sdpa")  # fmt: skip
    model = GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 64, (64, 32, 40), generator=g)
    t0 = time.perf_counter()
    for step in range(64):
        loss = model(data[step], labels=data[step]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    dt = time.perf_counter() - t0
    ops = {"gpt2_train64_weights": _hash(torch.cat([p.flatten() for p in model.parameters()])),
           "gpt2_train64_loss": f"{loss.item():.9g}"}  # fmt: skip
    return ops, 64 / dt


def training_ops() -> dict:
    """{op: hash} of every kernel the GPT-2 training above runs, at its shapes (32 x 40
    tokens, d_model 128, 4 heads, d_mlp 512, vocab 64), on inputs of their own generator
    (run after the training: the first stream stays as the team's tool has it). The MKL
    calls are those that MKL_VERBOSE lists for one step and those of the vector math seen
    at its entry points (vmsTanh, vmsSqrt); the rest are ATen's own kernels."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(1)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).requires_grad_()

    out = {}
    rows = 32 * 40
    # GPT-2's Conv1D: addmm(bias, x, W) forward; backward dx = g W^T, dW = x^T g (K = 1280), db.
    for name, k, n in [("c_attn", 128, 384), ("attn_c_proj", 128, 128), ("c_fc", 128, 512), ("mlp_c_proj", 512, 128)]:
        x, w, b = r(rows, k), r(k, n, scale=0.02), r(n, scale=0.02)
        y = torch.addmm(b, x, w)
        y.backward(torch.randn(rows, n, generator=g))
        out.update({f"t_{name}_fwd": _hash(y), f"t_{name}_dx": _hash(x.grad), f"t_{name}_dw": _hash(w.grad),
                    f"t_{name}_db": _hash(b.grad)})  # fmt: skip
    # The tied lm head: F.linear without bias, (1280, 128) x (64, 128)^T.
    x, w = r(rows, 128), r(64, 128, scale=0.02)
    y = F.linear(x, w)
    y.backward(torch.randn(rows, 64, generator=g))
    out.update(t_lm_head_fwd=_hash(y), t_lm_head_dx=_hash(x.grad), t_lm_head_dw=_hash(w.grad))
    # Attention as GPT-2 calls it: 40 positions (blocks of 32 and 8 rows), causal, head dim 32.
    q, k_, v = (r(32, 4, 40, 32) for _ in range(3))
    o = F.scaled_dot_product_attention(q, k_, v, is_causal=True)
    o.backward(torch.randn(*o.shape, generator=g))
    out.update(t_sdpa_fwd=_hash(o), t_sdpa_dq=_hash(q.grad), t_sdpa_dk=_hash(k_.grad), t_sdpa_dv=_hash(v.grad))
    # gelu_new (transformers' NewGELUActivation: torch.tanh, MKL's vmsTanh on 655,360
    # values) forward and backward, on pre-activations of GPT-2's scale; tanh alone on
    # the wide range of its argument (saturation and tiny-argument branches).
    z = r(32, 40, 512, scale=2.0)
    ge = 0.5 * z * (1.0 + torch.tanh(0.7978845608028654 * (z + 0.044715 * torch.pow(z, 3.0))))
    ge.backward(torch.randn(*ge.shape, generator=g))
    out.update(t_gelu_new_fwd=_hash(ge), t_gelu_new_dx=_hash(z.grad))
    wide = torch.cat([torch.randn(200_000, generator=g) * s for s in (1e-4, 0.1, 1.0, 5.0, 30.0)])
    out["t_tanh_wide"] = _hash(torch.tanh(wide))
    # Adam's sqrt (MKL's vmsSqrt) at the sizes of the parameters, on second moments of Adam's scale.
    sizes = [65536, 49152, 16384, 8192, 512, 384, 128]
    out["t_sqrt_adam"] = _hash(torch.cat([(torch.rand(n, generator=g) * 1e-4).sqrt() for n in sizes]))
    # How many of 10^6 such square roots are not the IEEE (correctly rounded) one: float64's
    # square root of a float32, rounded to float32, is (numpy's, not MKL's).
    x = torch.rand(1_000_000, generator=g) * 1e-4
    ieee = torch.from_numpy(np.sqrt(x.numpy().astype(np.float64)).astype(np.float32))
    out["t_sqrt_not_ieee"] = str(int((x.sqrt() != ieee).sum()))
    # Embedding forward and backward (token and position tables, 64 x 128).
    table = r(64, 128, scale=0.02)
    ids = torch.randint(0, 64, (32, 40), generator=g)
    e = F.embedding(ids, table)
    e.backward(torch.randn(*e.shape, generator=g))
    out.update(t_embedding_fwd=_hash(e), t_embedding_dw=_hash(table.grad))
    # Layer norm with its weight and bias gradients.
    z, w, b = r(32, 40, 128), r(128), r(128)
    ln = F.layer_norm(z, (128,), w, b)
    ln.backward(torch.randn(*ln.shape, generator=g))
    out.update(t_layernorm_fwd=_hash(ln), t_layernorm_dx=_hash(z.grad), t_layernorm_dw=_hash(w.grad),
               t_layernorm_db=_hash(b.grad))  # fmt: skip
    # Cross entropy over the 1280 positions.
    lg = r(rows, 64)
    ce = F.cross_entropy(lg, torch.randint(0, 64, (rows,), generator=g))
    ce.backward()
    out.update(t_cross_entropy=_hash(ce.reshape(1)), t_cross_entropy_dx=_hash(lg.grad))
    # Five optimizer steps on parameters of the training's shapes: AdamW (the fingerprint's
    # training) and Adam (the project's training loop).
    for name, cls in (("adamw", torch.optim.AdamW), ("adam", torch.optim.Adam)):
        params = [torch.randn(n, generator=g).mul_(0.02).requires_grad_() for n in sizes]
        opt = cls(params, lr=1e-3)
        for _ in range(5):
            for q_ in params:
                q_.grad = torch.randn(q_.shape, generator=g)
            opt.step()
        out[f"t_{name}_5steps"] = _hash(torch.cat([q_.detach() for q_ in params]))
    return out


def child(ops_only: bool) -> dict:
    import torch
    import transformers

    ops = kernel_ops()
    g = ops.pop("_generator")
    meta = {"capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
            "transformers": transformers.__version__}  # fmt: skip
    if not ops_only:
        train, speed = train_gpt2(g)
        ops.update(train)
        meta["steps_per_s"] = round(speed, 2)
    ops.update(training_ops())
    return {"ops": ops, "meta": meta}


# ---- The preloaded libraries: MKL dispatching as on Intel (the pinned modes on other
# vendors' CPUs), and a correctly rounded torch.sqrt (the exact mode on every CPU) ----------
INTEL_DISPATCH = "+intel-dispatch"
IEEE_SQRT = "+ieee-sqrt"
SUFFIXES = (INTEL_DISPATCH, IEEE_SQRT)  # in this order in a preset's name


def parse_preset(name: str) -> tuple[str, bool, bool]:
    """A preset's name as (MKL branch preset, vendor override, IEEE sqrt); SystemExit
    naming the choices for an unknown one."""
    base, *rest = name.split("+")
    suffixes = ["+" + r for r in rest]
    if base not in PRESETS or any(x not in SUFFIXES for x in suffixes) or len(set(suffixes)) < len(suffixes):
        raise SystemExit(f"unknown preset {name!r}; choose from {sorted(PRESETS)} (each also with "
                         f"{' and/or '.join(SUFFIXES)}) or the modes {sorted(MODE_PRESET)}")  # fmt: skip
    parsed = base, INTEL_DISPATCH in suffixes, IEEE_SQRT in suffixes
    if preset_name(*parsed) != name:  # one name per preset, as files store it
        raise SystemExit(f"preset {name!r} is written {preset_name(*parsed)!r}")
    return parsed


def preset_name(base: str, dispatch: bool, sqrt: bool) -> str:
    return base + (INTEL_DISPATCH if dispatch else "") + (IEEE_SQRT if sqrt else "")


def mode_preset(mode: str, vendor: str) -> str:
    """The preset a pinned mode runs as on a CPU of ``vendor``: its MKL branch, with MKL's
    vendor override on every vendor but Intel (numerics.needs_intel_dispatch), and for the
    exact mode the correctly rounded square root (numerics.needs_ieee_sqrt)."""
    return preset_name(MODE_PRESET[mode], vendor != numerics.INTEL_VENDOR, mode == "exact")


def default_presets() -> list[str]:
    """Every preset as MKL dispatches by itself, on a CPU that is not an Intel one each
    preset again with the vendor override, and the modes as this CPU runs them."""
    names = list(PRESETS)
    if numerics.needs_intel_dispatch():
        names += [n + INTEL_DISPATCH for n in PRESETS]
    return list(dict.fromkeys(names + [mode_preset(m, numerics.cpu_vendor()) for m in MODE_PRESET]))


def check_preset(name: str) -> str:
    parse_preset(name)
    return name


def _child_env(name: str, emulate: str | None = None) -> dict:
    base, dispatch, sqrt = parse_preset(name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEARED)}
    env.update(PRESETS[base])
    env.update(EMULATED_CPUS[emulate] if emulate else {})
    preload = [x for x in env.get("LD_PRELOAD", "").split() if not numerics.is_override_library(x)]
    preload[:0] = ([str(numerics.intel_dispatch_library())] if dispatch else []) + (
        [str(numerics.ieee_sqrt_library())] if sqrt else []
    )
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = " ".join(preload)
    return env


def run_preset(name: str, ops_only: bool, emulate: str | None = None) -> dict:
    cmd = [sys.executable, __file__, "--child"] + (["--ops-only"] if ops_only else [])
    r = subprocess.run(cmd, env=_child_env(name, emulate), capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"fingerprint preset {name} failed:\n{r.stderr[-3000:]}")
    base, dispatch, sqrt = parse_preset(name)
    rec = {"env": {**PRESETS[base], **(EMULATED_CPUS[emulate] if emulate else {})},
           **json.loads(r.stdout.strip().splitlines()[-1])}  # fmt: skip
    rec["mkl_intel_dispatch"], rec["ieee_sqrt"] = dispatch, sqrt
    return rec


def fingerprint(presets: list[str], ops_only: bool = False, emulate: str | None = None) -> dict:
    res = {"cpu": numerics.cpu_model(), "cpu_vendor": numerics.cpu_vendor(),
           "date": time.strftime("%Y-%m-%d"), "presets": {}}  # fmt: skip
    if emulate:
        res["cpu"] += f" emulating a CPU with at most {emulate.upper()} ({EMULATED_CPUS[emulate]})"
    for p in map(check_preset, presets):
        res["presets"][p] = run_preset(p, ops_only, emulate)
        print(f"{p}: {res['presets'][p]['meta']}", file=sys.stderr)
    return res


def compare(mine: dict, other: dict) -> list[dict]:
    """Per mode, this machine's run of it against the other's (each as its vendor runs
    it: mode_preset), then per preset in both: the ops both have, and those whose hashes
    differ. Ops one side lacks (an --ops-only file has no training entry; an older file no
    ``t_`` ops) are left out, and counted."""
    rows = []

    def row(label, mode, pa, pb):
        if pa in mine["presets"] and pb in other["presets"]:
            a, b = mine["presets"][pa]["ops"], other["presets"][pb]["ops"]
            common = [k for k in a if k in b]
            rows.append({"preset": label, "mode": mode, "ops": len(common),
                         "differ": [k for k in common if a[k] != b[k]]})  # fmt: skip

    for mode in MODE_PRESET:
        pa, pb = mode_preset(mode, mine.get("cpu_vendor", "?")), mode_preset(mode, other.get("cpu_vendor", "?"))
        row(pa if pa == pb else f"{pa} vs {pb}", mode, pa, pb)
    for p in sorted(set(mine["presets"]) & set(other["presets"])):
        row(p, "", p, p)
    # each branch as MKL runs it for Intel: the override's presets against an Intel file's own
    for a, b in ((mine, other), (other, mine)):
        if a.get("cpu_vendor") != numerics.INTEL_VENDOR and b.get("cpu_vendor") == numerics.INTEL_VENDOR:
            for p in sorted(b["presets"]):
                base, dispatch, sqrt = parse_preset(p)
                q = preset_name(base, True, sqrt)
                if not dispatch and q in a["presets"]:
                    pa, pb = (q, p) if a is mine else (p, q)
                    row(f"{pa} vs {pb}", "", pa, pb)
    return rows


def committed() -> list[dict]:
    """The committed fingerprints (benchmarks/fingerprints/*.json, traces excluded)."""
    return [json.loads(f.read_text()) for f in sorted(FINGERPRINTS.glob("*.json")) if "-trace-" not in f.name]


def cross_vendor(files: list[dict], mode: str) -> dict:
    """What the committed fingerprints show for ``mode`` across CPU vendors, each file read
    as its vendor runs the mode (mode_preset): the vendors measured, each op's verdict
    (``same``: every vendor's files agree; ``differs``; ops that fewer than two vendors
    measured are left out), and whether the 64-step training weights agree (``None`` when
    fewer than two vendors trained)."""
    by_op: dict[str, dict[str, set]] = {}
    vendors = set()
    for f in files:
        vendor = f.get("cpu_vendor", "?")
        preset = f.get("presets", {}).get(mode_preset(mode, vendor))
        if preset is None:
            continue
        vendors.add(vendor)
        for op, h in preset["ops"].items():
            by_op.setdefault(op, {}).setdefault(vendor, set()).add(h)
    verdict = {}
    for op, hashes in by_op.items():
        if len(hashes) >= 2:
            verdict[op] = "same" if len(set().union(*hashes.values())) == 1 else "differs"
    training = {"same": True, "differs": False}.get(verdict.get("gpt2_train64_weights"))
    return {"vendors": sorted(vendors), "ops": verdict, "training_same": training}


def disagreements(files: dict[str, dict], mode: str) -> tuple[list[str], set[str]]:
    """Every pair of fingerprints ({name: file}) that ran ``mode`` (each as its vendor runs
    it) and differ on an op both measured, as 'a vs b: ops'; and the vendors that ran it."""
    ran = {n: f["presets"][mode_preset(mode, f.get("cpu_vendor", "?"))]["ops"] for n, f in files.items()
           if mode_preset(mode, f.get("cpu_vendor", "?")) in f.get("presets", {})}  # fmt: skip
    names, out = sorted(ran), []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if differ := [k for k in ran[a] if k in ran[b] and ran[a][k] != ran[b][k]]:
                out.append(f"{a} vs {b}: {', '.join(differ)}")
    return out, {files[n].get("cpu_vendor", "?") for n in ran}


def trace_disagreements(traces: dict[str, dict], mode: str) -> tuple[list[str], set[str]]:
    """The same for operation traces ({name: trace}) of ``mode``, per target: every pair
    whose comparison is not SAME, with its first difference; and the vendors that traced it."""
    ran = {n: t for n, t in traces.items() if t.get("cpu_vendor") and t["preset"] == mode_preset(mode, t["cpu_vendor"])}
    names, out = sorted(ran), []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if ran[a].get("target", "gpt2") == ran[b].get("target", "gpt2"):
                text = compare_traces(ran[a], ran[b])
                if "\n  SAME: " not in text:
                    out.append(f"{a} vs {b}: {text}")
    return out, {t["cpu_vendor"] for t in ran.values()}


def report(mine: dict, files: list[Path]) -> tuple[str, bool]:
    """The comparison as text, and whether both pinned modes (each promising the same bits
    on Intel and AMD) agreed with every file that ran them."""
    lines, all_same = [], True
    for f in files:
        other = json.loads(Path(f).read_text())
        lines.append(f"{mine['cpu']} ({mine.get('cpu_vendor', '?')})  vs  {other['cpu']} "
                     f"({other.get('cpu_vendor', '?')}): {Path(f).name}")  # fmt: skip
        if other.get("provenance"):
            lines.append(f"  provenance: {other['provenance']}")
        for row in compare(mine, other):
            label = f"mode {row['mode']}: {row['preset']}" if row["mode"] else row["preset"]
            verdict = f"SAME ({row['ops']} ops)" if not row["differ"] else "differs: " + ", ".join(row["differ"])
            lines.append(f"  {label:54s} {verdict}")
            if row["mode"] and row["differ"]:
                all_same = False
    return "\n".join(lines), all_same


# ---- Operation traces ----------------------------------------------------------------------
TRACE_TARGETS = ("gpt2", "heroes", "coax", "gim")


def _uninitialized(op: str) -> bool:
    """Ops whose output is memory not yet written (its bytes mean nothing)."""
    return op.split(".")[1].startswith(("empty", "new_empty")) if op.startswith("aten.") else False


def _trace_child(target: str, steps: int) -> dict:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    torch.set_num_threads(1)

    def h(t) -> str | None:
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            return None
        return hashlib.sha256(t.detach().contiguous().to(torch.float32).numpy().tobytes()).hexdigest()[:12]

    trace = []

    class Tracer(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            ins = [h(t) for t in tree_flatten((args, kwargs))[0]]
            out = func(*args, **kwargs)
            flat = tree_flatten(out)[0]
            shapes = [list(t.shape) for t in flat if isinstance(t, torch.Tensor)]
            outs = [] if _uninitialized(str(func)) else [x for x in map(h, flat) if x]
            trace.append({"op": str(func), "in": [x for x in ins if x], "out": outs,
                          "shape": shapes[:2]})  # fmt: skip
            return out

    if target in ("coax", "gim"):  # the paper's own training function, traced whole
        run, trained = _project_training(target, steps)
        with Tracer():
            out = run()
        model = trained(out)
        trace.append({"op": "--- end of training", "in": [],
                      "out": [h(torch.cat([p.detach().flatten() for p in model.parameters()]))], "shape": []})  # fmt: skip
        return {"trace": trace, "target": target, "capability": torch.backends.cpu.get_cpu_capability(),
                "torch": torch.__version__}  # fmt: skip
    model, step_fn, data_hash = _trace_setup(target, steps)
    for name, p in model.named_parameters():
        trace.append({"op": f"--- init {name}", "in": [], "out": [h(p)], "shape": [list(p.shape)]})
    trace.append({"op": "--- data", "in": [], "out": [data_hash], "shape": []})
    for step in range(steps):
        with Tracer():
            step_fn(step)
        trace.append({"op": f"--- end of step {step}", "in": [],
                      "out": [h(torch.cat([p.detach().flatten() for p in model.parameters()]))], "shape": []})  # fmt: skip
    return {"trace": trace, "target": target, "capability": torch.backends.cpu.get_cpu_capability(),
            "torch": torch.__version__}  # fmt: skip


def _project_training(target: str, steps: int):
    """A call that trains paper B's toy IOI model (``coax``: seed 1) or paper C's arithmetic
    model (``gim``: l2h4, seed 0) for ``steps`` steps with the default config's settings,
    initialization and data included: (run, trained), where ``trained(run())`` is the model."""
    import tempfile

    import yaml

    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    if target == "coax":
        from selfrepair.coax.ioi_experiment import train_toy

        c = cfg["coax"]["ioi"]
        tr = {**c["train"], "max_steps": steps, "eval_every": steps}
        return (lambda: train_toy(**c["model"], seed=1, **tr)[0]), (lambda m: m)
    from selfrepair.gim.training import train_task_model
    from selfrepair.tasks.registry import get_task

    c = cfg["gim"]
    model = {k: v for k, v in c["models"][0].items() if k != "name"}
    tr = {**c["train"], "max_steps": steps, "eval_every": steps}
    folder = Path(tempfile.mkdtemp(prefix="trace-gim-")) / "model"

    def trained(_):
        from selfrepair.core.models import load_hf

        return load_hf(folder)

    return (lambda: train_task_model(get_task("arithmetic"), folder, **model, seed=0, **tr)), trained


def _trace_setup(target: str, steps: int):
    """(model, step(i), hash of the data) of a trace target."""
    import torch

    if target == "gpt2":  # the team's op_trace.py: the fingerprint's GPT-2, data of seed 1
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        cfg = GPT2Config(vocab_size=64, n_positions=64, n_embd=128, n_layer=4, n_head=4,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="sdpa")  # fmt: skip
        model = GPT2LMHeadModel(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = torch.randint(0, 64, (steps, 32, 40), generator=torch.Generator().manual_seed(1))

        def step_fn(i):
            loss = model(data[i], labels=data[i]).loss
            opt.zero_grad()
            loss.backward()
            opt.step()

        return model, step_fn, hashlib.sha256(data.numpy().tobytes()).hexdigest()[:12]
    if target == "heroes":  # paper A's model and loop (config/config.yaml, sort, seed 42)
        import yaml

        from selfrepair.core import models, train
        from selfrepair.tasks import sequences as S

        cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["heroes"]
        m, t = cfg["model"], cfg["train"]
        config = models.gpt2_toy_config(S.VOCAB, n_layers=m["n_layers"], n_heads=m["n_heads"], d_model=m["d_model"],
                                        d_mlp=m["d_mlp"], n_ctx=2 * max(cfg["ood"]["lengths"]) + 4,
                                        bos_token_id=S.START, eos_token_id=S.END)  # fmt: skip
        model = models.build_gpt2_toy(config, init=m["init"], seed=42, positional=False)
        gen = torch.Generator().manual_seed(42)
        batches = [S.training_batch("sort", t["batch_size"], t["min_len"], t["max_len"], gen, t["padding"])
                   for _ in range(steps)]  # fmt: skip
        model.train()
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=t["lr"])

        def step_fn(i):  # core.train.train's step
            b = batches[i]
            loss = train.masked_lm_loss(model(input_ids=b.tokens).logits, b.targets, b.mask)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        data = torch.cat([b.tokens.flatten() for b in batches]).numpy().tobytes()
        return model, step_fn, hashlib.sha256(data).hexdigest()[:12]
    raise ValueError(f"unknown trace target {target!r}; choose from {TRACE_TARGETS}")


def trace(name: str, target: str = "gpt2", steps: int = 2) -> dict:
    """Every ATen operation of ``steps`` training steps of ``target`` under preset ``name``."""
    check_preset(name)
    cmd = [sys.executable, __file__, "--child-trace", target, "--steps", str(steps)]
    r = subprocess.run(cmd, env=_child_env(name), capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"trace {target} under {name} failed:\n{r.stderr[-3000:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    return {"cpu": numerics.cpu_model(), "cpu_vendor": numerics.cpu_vendor(), "date": time.strftime("%Y-%m-%d"),
            "preset": name, "env": PRESETS[parse_preset(name)[0]], **res}  # fmt: skip


def compare_traces(a: dict, b: dict) -> str:
    """The first operation whose outputs differ between two traces, and whether its inputs
    agreed (then that kernel is the one that differs), with its neighbours; or SAME."""
    head = f"{a['cpu']} ({a['preset']}, {a.get('target', 'gpt2')})  vs  {b['cpu']} ({b['preset']}, {b.get('target', 'gpt2')})"
    if a.get("target", "gpt2") != b.get("target", "gpt2"):
        return head + "\n  not comparable: traces of different targets"
    ta, tb = a["trace"], b["trace"]
    for i, (x, y) in enumerate(zip(ta, tb)):
        if x["op"] != y["op"]:
            return head + f"\n  op {i}: different call sequence: {x['op']} vs {y['op']}"
        if x["out"] != y["out"] and not _uninitialized(x["op"]):
            lines = [head, f"  first divergence at op {i}: {x['op']} shape {x['shape']}; inputs "
                           f"{'agree: this kernel differs' if x['in'] == y['in'] else 'DIFFER'}"]  # fmt: skip
            for j in range(max(0, i - 3), min(len(ta), i + 4)):
                lines.append(f"    {j:6d} {ta[j]['op']:45s} {ta[j]['shape']}  {ta[j]['out'][:1]} {tb[j]['out'][:1]}")
            return "\n".join(lines)
    if len(ta) != len(tb):
        return head + f"\n  the first {min(len(ta), len(tb))} operations agree; the traces have {len(ta)} and {len(tb)}"
    return head + f"\n  SAME: {len(ta)} operations agree"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", help="comma-separated presets or modes (exact, fast: as this CPU runs them); "
                    "default: every preset, and on a CPU that is not an Intel one each again with MKL's vendor override")  # fmt: skip
    ap.add_argument("--ops-only", action="store_true", help="skip the 64-step GPT-2 training (seconds, not minutes)")
    ap.add_argument("--out", help="write this machine's fingerprint (or trace) here (JSON)")
    ap.add_argument("--compare", nargs="+", metavar="JSON", help="compare the first file with each of the others")
    ap.add_argument("--trace", action="store_true", help="trace every ATen operation of two training steps")
    ap.add_argument("--preset", default="fast", help="the trace's preset or mode (default: fast, as this CPU runs it)")
    ap.add_argument("--target", default="gpt2", choices=TRACE_TARGETS, help="the trace's training (default: gpt2)")
    ap.add_argument("--steps", type=int, default=2, help="the trace's training steps (default: 2)")
    ap.add_argument(
        "--compare-trace", nargs="+", metavar="JSON", help="compare the first trace with each of the others"
    )
    ap.add_argument("--mkl-intel-dispatch", action="store_true",
                    help="every preset named with MKL's vendor override (presets <name>+intel-dispatch; needs cc)")  # fmt: skip
    ap.add_argument("--emulate", choices=sorted(EMULATED_CPUS),
                    help="cap every library at a lesser CPU's instruction set (a CPU without AVX2)")  # fmt: skip
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-trace", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.ops_only)))
        return
    if a.child_trace:
        print(json.dumps(_trace_child(a.child_trace, a.steps)))
        return
    if a.compare:
        if len(a.compare) < 2:
            ap.error("--compare needs this machine's file and at least one other")
        text, _ = report(json.loads(Path(a.compare[0]).read_text()), a.compare[1:])
        print(text)
        return
    if a.compare_trace:
        if len(a.compare_trace) < 2:
            ap.error("--compare-trace needs this machine's trace and at least one other")
        mine = json.loads(Path(a.compare_trace[0]).read_text())
        for f in a.compare_trace[1:]:
            print(f"{Path(f).name}: {compare_traces(mine, json.loads(Path(f).read_text()))}")
        return
    vendor = numerics.cpu_vendor()
    if a.trace and a.emulate:
        ap.error("--emulate applies to fingerprints, not to --trace")
    if a.trace:
        name = mode_preset(a.preset, vendor) if a.preset in MODE_PRESET else a.preset
        base, dispatch, sqrt = parse_preset(name)
        name = preset_name(base, dispatch or a.mkl_intel_dispatch, sqrt)
        res = trace(name, a.target, a.steps)
        print(f"{len(res['trace'])} operations traced ({res['preset']}, {a.target}, {a.steps} steps)", file=sys.stderr)
    else:
        names = default_presets() if a.presets is None else a.presets.split(",")
        names = [mode_preset(p, vendor) if p in MODE_PRESET else p for p in names]
        if a.mkl_intel_dispatch:
            names = list(dict.fromkeys(preset_name(b, True, q) for b, _, q in map(parse_preset, names)))
        res = fingerprint(names, a.ops_only, a.emulate)
    s = json.dumps(res, indent=None if a.trace else 1)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(s + "\n")
    else:
        print(s)


if __name__ == "__main__":
    main()
