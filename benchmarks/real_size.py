"""The papers' own models at their real size, on random weights: does every real-model
rule run, what does it cost, what does it need?

For every model that ``coax.real`` and ``gim.mib`` name, a random-weight model of its
published configuration (transformers' config classes; :data:`CONFIGS`) is saved with
``save_pretrained`` under ``--root``, with a word-level stand-in tokenizer (the IOI names,
places and objects as single tokens) and small MIB-format datasets. A model whose fp32
weights would pass ``--max-params`` (Llama-3.1-8B in 24 GB) is built at its real width
with fewer layers, and its costs are projected by layers (``layer_exponent``: 2 for COAX's scans, whose
heads grow with the layers, 1 for MIB's methods), and to the default config's number of
prompts (``hours_config_projected``: hours on one thread, from the wall seconds, linear
in rows).

Each part then runs through the workflow, one Snakemake job per (model, part), with
``search_paths`` pointing at the stand-ins: COAX IOI, wake-up and induction (rule
``coax_real``), and MIB per method with its faithfulness curves (rule ``gim_mib``). The
job's ``benchmark:`` file gives wall and CPU seconds and peak memory; the outputs are
checked (the status row says 'ran', the tables exist, the MIB graph's edge count against
MIB's published one where there is one). One row per (model, part) goes to
``results/benchmarks/real_size.csv`` (``--out``; with ``--write`` also into
``results/reference/real_size.csv``; rows of other models and parts already there are
kept, so the models can be measured one at a time):

    python benchmarks/real_size.py --models gpt2 --parts ioi wakeup mib:eap [--write]
    python benchmarks/real_size.py --list           # the models and parts it knows
    python benchmarks/real_size.py --markdown --out results/reference/real_size.csv  # docs/results/not-run.md's table

``--device cuda`` runs the rules on a GPU (``--max-params`` then sizes GPU memory).

Random weights say nothing about the papers' numbers; they say that the path runs at
that size, how long it takes and how much memory it needs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the harness, when loaded by its path (tests)
import harness  # noqa: E402
from harness import ROOT, commit, machine  # noqa: E402

STAND_INS = Path.home() / ".cache" / "selfrepair" / "real_size"  # --root's default

# The published configurations (each model's config.json on the Hugging Face hub), as
# (transformers config class, its arguments). Vocabulary sizes are the models' own; the
# stand-in tokenizer uses the first few hundred ids.
CONFIGS = {
    "gpt2": ("GPT2Config", dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)),
    "gpt2-medium": ("GPT2Config", dict(n_layer=24, n_embd=1024, n_head=16, vocab_size=50257, n_positions=1024)),
    "gpt2-large": ("GPT2Config", dict(n_layer=36, n_embd=1280, n_head=20, vocab_size=50257, n_positions=1024)),
    "EleutherAI/pythia-160m": ("GPTNeoXConfig", dict(
        num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072, vocab_size=50304,
        rotary_pct=0.25, max_position_embeddings=2048, use_parallel_residual=True)),
    "EleutherAI/pythia-410m": ("GPTNeoXConfig", dict(
        num_hidden_layers=24, hidden_size=1024, num_attention_heads=16, intermediate_size=4096, vocab_size=50304,
        rotary_pct=0.25, max_position_embeddings=2048, use_parallel_residual=True)),
    "EleutherAI/pythia-1.4b": ("GPTNeoXConfig", dict(
        num_hidden_layers=24, hidden_size=2048, num_attention_heads=16, intermediate_size=8192, vocab_size=50304,
        rotary_pct=0.25, max_position_embeddings=2048, use_parallel_residual=True)),
    "EleutherAI/gpt-neo-1.3B": ("GPTNeoConfig", dict(
        num_layers=24, hidden_size=2048, num_heads=16, vocab_size=50257, max_position_embeddings=2048,
        attention_types=[[["global", "local"], 12]], window_size=256)),
    "google/gemma-2-2b": ("Gemma2Config", dict(
        num_hidden_layers=26, hidden_size=2304, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
        intermediate_size=9216, vocab_size=256000, max_position_embeddings=8192, sliding_window=4096,
        query_pre_attn_scalar=256, attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
    "Qwen/Qwen2.5-0.5B": ("Qwen2Config", dict(
        num_hidden_layers=24, hidden_size=896, num_attention_heads=14, num_key_value_heads=2,
        intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True,
        rope_theta=1e6)),
    "Qwen/Qwen2.5-7B": ("Qwen2Config", dict(
        num_hidden_layers=28, hidden_size=3584, num_attention_heads=28, num_key_value_heads=4,
        intermediate_size=18944, vocab_size=152064, max_position_embeddings=131072, rope_theta=1e6)),
    "allenai/OLMo-2-1124-7B": ("Olmo2Config", dict(
        num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=32,
        intermediate_size=11008, vocab_size=100352, max_position_embeddings=4096, rope_theta=5e5)),
    "meta-llama/Llama-3.1-8B": ("LlamaConfig", dict(
        num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=14336, vocab_size=128256, max_position_embeddings=131072, rope_theta=5e5)),
}  # fmt: skip
LAYER_KEYS = ("n_layer", "num_hidden_layers", "num_layers")
# Edge counts MIB publishes for its models' graphs (SPEC.md; the others are ours, stated)
MIB_EDGES = {"gpt2": 32491}
MIB_DATASET = "ioi"


def n_layers_of(kwargs: dict) -> int:
    return next(int(kwargs[k]) for k in LAYER_KEYS if k in kwargs)


def with_layers(kwargs: dict, layers: int) -> dict:
    """The configuration with ``layers`` layers (GPT-Neo's alternating global/local
    attention pattern cut to match)."""
    key = next(k for k in LAYER_KEYS if k in kwargs)
    out = {**kwargs, key: int(layers)}
    if "attention_types" in kwargs:
        out["attention_types"] = [[["global", "local"], layers // 2]] + ([[["global"], 1]] if layers % 2 else [])
        out["attention_types"] = [t for t in out["attention_types"] if t[1] > 0]
    return out


def n_params(cls_name: str, kwargs: dict) -> int:
    """Parameters of the configuration, counted on the meta device (no memory)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    cfg = getattr(transformers, cls_name)(**kwargs)
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in m.parameters())


def fitting_layers(cls_name: str, kwargs: dict, max_params: float) -> int:
    """The most layers (at most the real number) whose model has at most ``max_params``."""
    real = n_layers_of(kwargs)
    if max_params == float("inf"):
        return real
    one = n_params(cls_name, with_layers(kwargs, 1))
    two = n_params(cls_name, with_layers(kwargs, 2))
    per_layer, fixed = two - one, one - (two - one)
    fit = int((max_params - fixed) // per_layer) if per_layer else real
    if fit < 1:
        raise SystemExit(f"{cls_name}: even one layer has {one / 1e9:.2f}B parameters, over --max-params")
    return min(real, fit)


def stand_in_words() -> list[str]:
    from selfrepair.tasks import ioi

    words = ["<unk>", "<bos>", ",", "When", "and", "went", "to", "the", "gave", "a"]
    for w in [*ioi.NAMES, *ioi.PLACES, *ioi.OBJECTS, *getattr(ioi, "AUTHORS_NAMES", []),
              *getattr(ioi, "AUTHORS_PLACES", []), *getattr(ioi, "AUTHORS_OBJECTS", [])]:  # fmt: skip
        if w not in words:
            words.append(w)
    return words + [f"t{i}" for i in range(40)]  # the MIB stand-in datasets' words


def save_tokenizer(folder: Path, words: list[str]) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<bos>", pad_token="<unk>"
    ).save_pretrained(str(folder))


def heads_per_layer(kwargs: dict) -> int:
    return int(next(kwargs[k] for k in ("n_head", "num_attention_heads", "num_heads") if k in kwargs))


def models_root(root: Path, layers: int, real_layers: int) -> Path:
    """Where a stand-in lies: ``models/`` at its real depth, ``models-<L>-layers/`` else
    (the rules find a model by its name under a search path)."""
    return root / ("models" if layers == real_layers else f"models-{layers}-layers")


def build(name: str, root: Path, max_params: float, max_heads: int | None = None) -> dict:
    """The random-weight stand-in of ``name`` (built once): its real configuration, with
    fewer layers when its fp32 weights would pass ``max_params`` or its heads
    ``max_heads`` (COAX's scans cost heads x layers: the CPU time of the check)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    cls_name, kwargs = CONFIGS[name]
    real_layers = n_layers_of(kwargs)
    layers = fitting_layers(cls_name, kwargs, max_params)
    if max_heads:
        layers = min(layers, max(1, max_heads // heads_per_layer(kwargs)))
    folder = models_root(root, layers, real_layers) / name
    info = {"model": name, "architecture": cls_name.replace("Config", ""), "layers_real": real_layers,
            "layers_built": layers, "params_real": n_params(cls_name, kwargs),
            "params_built": n_params(cls_name, with_layers(kwargs, layers)),
            "models_root": str(models_root(root, layers, real_layers))}  # fmt: skip
    if not (folder / "config.json").exists():
        t = time.perf_counter()
        torch.manual_seed(0)
        cfg = getattr(transformers, cls_name)(**with_layers(kwargs, layers), bos_token_id=1, eos_token_id=1)
        model = AutoModelForCausalLM.from_config(cfg)
        model.save_pretrained(folder, safe_serialization=True)
        del model
        save_tokenizer(folder, stand_in_words())
        print(f"built {name}: {layers}/{real_layers} layers, {info['params_built'] / 1e6:.0f}M parameters "
              f"in {time.perf_counter() - t:.0f} s", flush=True)  # fmt: skip
    return info


def stand_in(folder: Path, name: str = "gpt2") -> Path:
    """``folder`` when it holds a model, else the stand-in of ``name`` at its real depth
    under the default --root (built there once; the benchmarks of the real-size paths)."""
    if (folder / "config.json").exists():
        return folder
    info = build(name, STAND_INS, float("inf"))
    print(f"no model at {folder}: the random-weight stand-in of {name} ({info['models_root']})", flush=True)
    return Path(info["models_root"]) / name


def write_mib_datasets(root: Path, n: int = 64) -> None:
    """Small MIB-format datasets (the fields MIB's hub datasets have) in the stand-in words."""
    import random

    rnd = random.Random(0)
    w = [f"t{i}" for i in range(10, 40)]
    ioi_rows, ari_rows, mcqa_rows = [], [], []
    for i in range(n):
        io, s = rnd.sample(w, 2)
        body = " ".join(rnd.choices(w, k=6))
        ioi_rows.append({"prompt": f"{io} {s} {body} {s}", "metadata": {"indirect_object": io, "subject": s},
                         "s2_io_flip_counterfactual": {"prompt": f"{io} {s} {body} {io}"}})  # fmt: skip
        a, b = rnd.randrange(10), rnd.randrange(10)
        ari_rows.append({"prompt": f"t{a} t{b} t9", "label": f"t{a + b + 10}",
                         "random_counterfactual": {"prompt": f"t{b} t{a + 1} t9", "label": f"t{a + b + 11}"}})  # fmt: skip
        labels = ["t1", "t2", "t3"]
        mcqa_rows.append({"prompt": " ".join(rnd.choices(w, k=8)) + " t1 t2 t3",
                          "choices": {"label": labels, "text": ["x", "y", "z"]}, "answerKey": i % 3,
                          "symbol_counterfactual": {"prompt": " ".join(rnd.choices(w, k=8)) + " t2 t3 t1",
                                                    "choices": {"label": ["t2", "t3", "t1"], "text": ["x", "y", "z"]},
                                                    "answerKey": i % 3}})  # fmt: skip
    for name, rows in (("ioi", ioi_rows), ("arithmetic_addition", ari_rows), ("copycolors_mcqa", mcqa_rows),
                       ("arc_easy", mcqa_rows)):  # fmt: skip
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows))


def workflow_models() -> tuple[dict, dict]:
    """coax.real and gim.mib as the default config gives them (schema defaults filled in)."""
    from snakemake.utils import validate

    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    coax, gim = cfg.get("coax", {}), cfg.get("gim", {})
    validate(coax, str(ROOT / "workflow" / "schemas" / "coax.schema.yaml"))
    validate(gim, str(ROOT / "workflow" / "schemas" / "gim.schema.yaml"))
    return coax["real"], gim["mib"]


def parts_of(name: str, real: dict, mib: dict, methods: list[str]) -> list[str]:
    parts = []
    if name == real["ioi_model"]:
        parts.append("ioi")
    if name in real["wakeup_models"]:
        parts.append("wakeup")
    if name in real["induction_models"]:
        parts.append("induction")
    if name in mib["models"]:
        parts += [f"mib:{m}" for m in methods]
    return parts


def mib_batch(n_eval: int, most: int = 20) -> int:
    """The largest batch of at most ``most`` (MIB's default) that divides ``n_eval``: under
    gim.weighting mib (MIB's batch weighting) every batch must be full."""
    return max(b for b in range(1, min(most, n_eval) + 1) if n_eval % b == 0)


def job_config(name: str, part: str, root: Path, models: str, n_prompts: int, n_eval: int) -> dict:
    data = str(root / "mib")
    absent = "/nonexistent/none"
    if part.startswith("mib:"):
        return {"papers": ["gim"], "gim": {"methods": [part[4:]], "mib": {
            "models": [name], "datasets": [MIB_DATASET], "search_paths": [models, data], "n_eval": n_eval,
            "batch_size": mib_batch(n_eval)}}}  # fmt: skip
    real = {"search_paths": [models], "ioi_model": absent, "wakeup_models": [], "induction_models": [],
            "n_prompts": n_prompts, "data_seeds": [11]}  # fmt: skip
    real["ioi_model" if part == "ioi" else f"{part}_models"] = name if part == "ioi" else [name]
    if part == "induction":
        real["induction_T"] = 16
    return {"papers": ["coax"], "coax": {"real": real, "induction": {"n_prompts": n_prompts}}}


def run_part(name: str, part: str, root: Path, info: dict, args) -> dict:
    """One (model, part) as one Snakemake job in its own folder; its row."""
    d = root / "runs" / name.replace("/", "__") / part.replace(":", "_")
    (d / "config").mkdir(parents=True, exist_ok=True)
    (d / "config" / "published.yaml").write_text((ROOT / "config" / "published.yaml").read_text())
    (d / "real_size.yaml").write_text(
        yaml.safe_dump(job_config(name, part, root, info["models_root"], args.n_prompts, args.n_eval))
    )
    mib = part.startswith("mib:")
    target = "results/gim/mib/status.csv" if mib else "results/coax/real/status.csv"
    bench = d / ("benchmarks/gim/mib.tsv" if mib else "benchmarks/coax/real.tsv")
    # python -m snakemake: no `snakemake` script beside sys.executable where the packages
    # were installed with pip's --target (the GPU bundle, benchmarks/gpu)
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(d),
           "--configfile", str(ROOT / "config" / "config.yaml"), str(d / "real_size.yaml"),
           "--config", f"device={args.device}", f"threads={args.threads}", "--cores", str(args.threads), "--forcerun",
           "gim_mib" if mib else "coax_real", "--", target]  # fmt: skip
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    row = {**info, "part": part, "machine": machine(), "commit": commit(), "device": args.device, "threads": args.threads,
           "n": args.n_eval if mib else args.n_prompts}  # fmt: skip
    row["snakemake_s"] = round(time.perf_counter() - t, 1)
    if r.returncode != 0 or not bench.exists():
        return {**row, "ran": False, "check": f"snakemake failed: {(r.stderr or r.stdout)[-300:]}"}
    b = pd.read_csv(bench, sep="\t").iloc[0]
    row.update(wall_s=round(float(b["s"]), 1), cpu_s=round(float(b["cpu_time"]), 1),
               peak_rss_gb=round(float(b["max_rss"]) / 1024, 2))  # fmt: skip
    status = pd.read_csv(d / target).fillna("")
    ok, check = check_outputs(name, part, d, status)
    k = 2 if part in ("ioi", "wakeup", "induction") else 1  # COAX scans: (heads ~ layers) x layers
    scale = (info["layers_real"] / info["layers_built"]) ** k
    # the default config's run: its prompts (pairs) and, for IOI, its prompt sets; cost ~ linear in rows
    n_cfg = args.cfg_mib["n_eval"] if mib else args.cfg_real["n_prompts"]
    sets = len(args.cfg_real["data_seeds"]) if part == "ioi" else 1
    row.update(
        ran=ok,
        check=check,
        layer_exponent=k,
        wall_s_all_layers=round(row["wall_s"] * scale, 1),
        config_n=n_cfg * sets,
        # from the wall seconds: Snakemake samples cpu_time, which misses most of a short job
        hours_config_projected=round(row["wall_s"] * scale * n_cfg * sets / row["n"] / 3600, 2),
        weights_gb_fp32=round(info["params_real"] * 4 / 1e9, 2),
    )
    return row


def check_outputs(name: str, part: str, d: Path, status: pd.DataFrame) -> tuple[bool, str]:
    if part.startswith("mib:"):
        row = status[(status.model == name) & (status.dataset == MIB_DATASET)]
        if row.empty or row.iloc[0]["status"] != "ran":
            return False, f"status: {row.iloc[0]['reason'] if len(row) else 'no row'}"
        loc = pd.read_csv(d / "results/gim/mib/localization.csv")
        if loc.empty:  # skipped for the graph's size (eactp), as the status row says
            return True, f"skipped: {row.iloc[0]['reason']}"
        n_edges = int(loc.n_edges.iloc[0])
        want = MIB_EDGES.get(name)
        edges = f"{n_edges} edges" + (f" (MIB: {want}, {'equal' if want == n_edges else 'DIFFERENT'})" if want else "")
        finite = bool(loc[["cpr", "cmd"]].notna().all().all())
        return finite and (
            want is None or want == n_edges
        ), f"{edges}; CPR {loc.cpr.iloc[0]:.3f}, CMD {loc.cmd.iloc[0]:.3f}"
    row = status[(status.model == name) & (status.experiment == part)]
    if row.empty or row.iloc[0]["status"] != "ran":
        return False, f"status: {row.iloc[0]['reason'] if len(row) else 'no row'}"
    tables = {"ioi": "ioi_summary.csv", "wakeup": "wakeup_models.csv", "induction": "induction.csv"}[part]
    t = pd.read_csv(d / "results/coax/real/tables" / tables)
    return len(t) > 0, f"{tables}: {len(t)} rows; identity {row.iloc[0]['identity']}"


def markdown(table: pd.DataFrame) -> str:
    """The table as docs/results/not-run.md shows it: one row per (model, part)."""
    cols = ["model", "part", "layers", "params (B)", "n", "ran", "wall s", "CPU s", "peak GB",
            "hours, default config (projected)", "check"]  # fmt: skip
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in table.iterrows():
        layers = f"{r.layers_built}/{r.layers_real}"
        cells = [r.model, r.part, layers, f"{r.params_real / 1e9:.2f}", r.n, "yes" if r.ran else "NO",
                 r.get("wall_s", ""), r.get("cpu_s", ""), r.get("peak_rss_gb", ""),
                 r.get("hours_config_projected", ""), str(r.check).replace("|", "/")]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = harness.arguments(__doc__.split("\n\n")[0], "real_size.csv", modes=False)
    ap.add_argument("--models", nargs="*", help="default: every model coax.real and gim.mib name")
    ap.add_argument("--parts", nargs="*", help="ioi wakeup induction mib:<method> (default: all of each model's)")
    ap.add_argument("--root", default=str(STAND_INS))
    ap.add_argument("--max-params", type=float, default=1.6e9, help="larger models get fewer layers")
    ap.add_argument("--max-heads", type=int, help="models with more heads get fewer layers (CPU time)")
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--n-eval", type=int, default=16)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="the rules' device (default cpu)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--markdown", action="store_true", help="print --out as a markdown table and stop")
    args = ap.parse_args(argv)
    if args.markdown:
        print(markdown(pd.read_csv(args.out)))
        return
    real, mib = workflow_models()
    args.cfg_real, args.cfg_mib = real, mib
    gim_cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["gim"]
    names = list(dict.fromkeys([real["ioi_model"], *real["wakeup_models"], *real["induction_models"], *mib["models"]]))
    unknown = [n for n in (args.models or []) + names if n not in CONFIGS]
    if unknown:
        raise SystemExit(f"no published configuration here for {unknown}; known: {sorted(CONFIGS)}")
    if args.list:
        for n in names:
            print(n, " ".join(parts_of(n, real, mib, gim_cfg["methods"])))
        return
    root = Path(args.root).expanduser()
    write_mib_datasets(root / "mib")
    for name in args.models or names:
        info = build(name, root, args.max_params, args.max_heads)
        for part in parts_of(name, real, mib, gim_cfg["methods"]):
            if args.parts and part not in args.parts:
                continue
            row = run_part(name, part, root, info, args)
            print(json.dumps(row), flush=True)
            harness.write(pd.DataFrame([row]), args, reference="real_size", keys=["model", "part"])


if __name__ == "__main__":
    main()
