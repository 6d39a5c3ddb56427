"""Which float kernels does this machine share with the machines whose fingerprints are
committed? The check that the numerics modes mean what they say, on any machine.

For each preset a child process starts with that preset's pins (they must be set before
torch is imported), runs a fixed list of operations on fixed inputs on one thread (the
GEMMs, linear and attention forward and backward, layer norm, GELU, softmax, cross
entropy, a long sum, exp/log/tanh) and, unless --ops-only, trains a small GPT-2 for 64
steps. Each result is hashed (SHA-256 prefix of its float32 bytes). Two CPUs whose hashes
agree for a preset run the same bits for those kernels under it.

The presets are the project's modes (``exact``, ``fast``: src/selfrepair/core/numerics.py)
and the other MKL branches tried when the modes were chosen. Their op list and inputs are
those of the team's fingerprint tool, so that files written by either compare.

    .venv/bin/python benchmarks/fingerprint.py --out mine.json            # every preset
    .venv/bin/python benchmarks/fingerprint.py --presets exact --ops-only --out mine.json
    .venv/bin/python benchmarks/fingerprint.py --compare mine.json benchmarks/fingerprints/*.json
    make fingerprint                                                      # the two together

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
    return {"ops": ops, "meta": meta}


def run_preset(name: str, ops_only: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEARED)}
    env.update(PRESETS[name])
    cmd = [sys.executable, __file__, "--child"] + (["--ops-only"] if ops_only else [])
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"fingerprint preset {name} failed:\n{r.stderr[-3000:]}")
    return {"env": PRESETS[name], **json.loads(r.stdout.strip().splitlines()[-1])}


def fingerprint(presets: list[str], ops_only: bool = False) -> dict:
    res = {"cpu": numerics.cpu_model(), "cpu_vendor": numerics.cpu_vendor(),
           "date": time.strftime("%Y-%m-%d"), "presets": {}}  # fmt: skip
    for p in presets:
        res["presets"][p] = run_preset(p, ops_only)
        print(f"{p}: {res['presets'][p]['meta']}", file=sys.stderr)
    return res


def compare(mine: dict, other: dict) -> list[dict]:
    """Per preset in both: the ops both have, and those whose hashes differ. Ops one side
    lacks (an --ops-only file has no training entry) are left out, and counted."""
    rows = []
    for p in sorted(set(mine["presets"]) & set(other["presets"])):
        a, b = mine["presets"][p]["ops"], other["presets"][p]["ops"]
        common = [k for k in a if k in b]
        rows.append({"preset": p, "mode": {v: k for k, v in MODE_PRESET.items()}.get(p, ""),
                     "ops": len(common), "differ": [k for k in common if a[k] != b[k]]})  # fmt: skip
    return rows


def report(mine: dict, files: list[Path]) -> tuple[str, bool]:
    """The comparison as text, and whether every mode preset agreed with every file."""
    lines, all_same = [], True
    for f in files:
        other = json.loads(Path(f).read_text())
        lines.append(f"{mine['cpu']} ({mine.get('cpu_vendor', '?')})  vs  {other['cpu']} "
                     f"({other.get('cpu_vendor', '?')}): {Path(f).name}")  # fmt: skip
        if other.get("provenance"):
            lines.append(f"  provenance: {other['provenance']}")
        for row in compare(mine, other):
            label = f"{row['preset']}" + (f" (mode {row['mode']})" if row["mode"] else "")
            verdict = f"SAME ({row['ops']} ops)" if not row["differ"] else "differs: " + ", ".join(row["differ"])
            lines.append(f"  {label:32s} {verdict}")
            if row["mode"] == "exact" and row["differ"]:
                all_same = False
    return "\n".join(lines), all_same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default=",".join(PRESETS), help="comma-separated presets (or modes: exact, fast)")
    ap.add_argument("--ops-only", action="store_true", help="skip the 64-step GPT-2 training (seconds, not minutes)")
    ap.add_argument("--out", help="write this machine's fingerprint here (JSON)")
    ap.add_argument("--compare", nargs="+", metavar="JSON", help="compare the first file with each of the others")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.ops_only)))
        return
    if a.compare:
        if len(a.compare) < 2:
            ap.error("--compare needs this machine's file and at least one other")
        text, _ = report(json.loads(Path(a.compare[0]).read_text()), a.compare[1:])
        print(text)
        return
    names = [MODE_PRESET.get(p, p) for p in a.presets.split(",")]
    if unknown := [p for p in names if p not in PRESETS]:
        ap.error(f"unknown presets {unknown}; choose from {sorted(PRESETS)} or the modes {sorted(MODE_PRESET)}")
    res = fingerprint(names, a.ops_only)
    s = json.dumps(res, indent=1)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(s + "\n")
    else:
        print(s)


if __name__ == "__main__":
    main()
