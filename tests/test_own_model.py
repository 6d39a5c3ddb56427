"""docs/OWN_MODEL.md as tested code: every ``python`` block runs (in order, one namespace,
as a reader runs them), and its results equal, bit for bit, what the workflow's scripts
write for the same model and data: each script (scripts/heroes_scores.py,
coax_ioi_run.py, gim_localize.py, groundtruth_model.py) runs here, in this process,
through runpy with a stand-in for Snakemake's ``snakemake`` object, on the folders the
examples built and the data they drew. CSV floats are written as Python's shortest
round-trip repr, so equal CSV text, or equal frames read back with
``float_precision="round_trip"``, means equal bits."""

from __future__ import annotations

import contextlib
import io
import os
import re
import runpy
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from selfrepair.core import numerics, runtime

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "OWN_MODEL.md"
NUMERICS = numerics.check_mode(os.environ.get("SELFREPAIR_TEST_NUMERICS", "fast"))  # conftest's
COMPUTE = dict(device="cpu", numerics=NUMERICS)


def python_blocks(path: Path = DOC) -> list[tuple[int, str]]:
    """(first line, code) of every ```python block of a markdown file."""
    out, block, start = [], None, 0
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if block is None and re.match(r"^```python\s*$", line):
            block, start = [], i + 1
        elif block is not None and line.startswith("```"):
            out.append((start, "\n".join(block)))
            block = None
        elif block is not None:
            block.append(line)
    assert block is None, f"{path.name}: a python block opened at line {start} is not closed"
    return out


@pytest.fixture(scope="module")
def examples():
    """The namespace after running every block of the page in order (stdout kept)."""
    ns: dict = {"__name__": "own_model_example"}
    shown = io.StringIO()
    for line, code in python_blocks():
        with contextlib.redirect_stdout(shown):
            try:
                exec(compile(code, f"{DOC.name}:{line}", "exec"), ns)
            except Exception as err:
                raise AssertionError(f"the example at {DOC.name}:{line} failed: {err!r}") from err
    ns["_stdout"] = shown.getvalue()
    yield ns
    shutil.rmtree(ns["root"], ignore_errors=True)  # the page's tempfile.mkdtemp()


def run_script(name: str, monkeypatch, log=(), **smk) -> None:
    """scripts/<name>.py with a stand-in ``snakemake`` (``log``: its log file, where the
    script needs one; sys.stderr is put back after the test whatever the script does)."""
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    fake = SimpleNamespace(log=list(log), threads=2, rule=name, **smk)
    runpy.run_path(str(ROOT / "scripts" / f"{name}.py"), init_globals={"snakemake": fake})


def read(path) -> pd.DataFrame:
    return pd.read_csv(path, float_precision="round_trip")


def test_the_page_has_one_example_per_paper():
    code = "\n".join(c for _, c in python_blocks())
    for call in ("gradient_importance(", "causal_importance(", "coax_scores(", "localize(", "shapley_values("):
        assert call in code, f"docs/OWN_MODEL.md shows no {call})"


def test_no_other_document_has_python_examples():
    """This module runs the python blocks of docs/OWN_MODEL.md only: any elsewhere would go untested."""
    others = [d for d in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))] if d != DOC]
    assert [d.name for d in others if python_blocks(d)] == []


def test_every_example_runs(examples):
    for name in ("G", "C", "scores", "summaries", "phi"):
        assert name in examples
    assert "ModelNotFound" not in examples["_stdout"] and "nothing is downloaded" in examples["_stdout"]


def heroes_inputs(tmp_path, batches, fresh) -> Path:
    """The OOD file heroes_ood writes (ood_batches.pt) for these batches."""
    f = tmp_path / "ood_batches.pt"
    runtime.save_tensors(
        f,
        {
            "status": "kept",
            "tokens": torch.stack([b.tokens for b in batches]),
            "targets": torch.stack([b.targets for b in batches]),
            "mask": torch.stack([b.mask for b in batches]),
            "eval_tokens": fresh.tokens,
            "eval_targets": fresh.targets,
            "eval_mask": fresh.mask,
        },
    )
    return f


def heroes_workflow(tmp_path, monkeypatch, folder, batches, fresh) -> SimpleNamespace:
    out = SimpleNamespace(
        **{k: str(tmp_path / f"{k}.{x}") for k, x in [("gradients", "csv"), ("ablations", "csv"), ("outcomes", "pt")]}
    )
    inp = SimpleNamespace(model=str(folder), batches=str(heroes_inputs(tmp_path, batches, fresh)))
    run_script(
        "heroes_scores", monkeypatch, input=inp, output=out, params=SimpleNamespace(normalization="sqrt", **COMPUTE)
    )
    return out


def test_paper_a_equals_the_workflow(examples, tmp_path, monkeypatch):
    ns = examples
    out = heroes_workflow(tmp_path, monkeypatch, ns["sort_folder"], ns["batches"], ns["fresh"])
    assert ns["G"].assign(status="kept").to_csv(index=False) == Path(out.gradients).read_text()
    assert ns["C"].to_csv(index=False) == Path(out.ablations).read_text()


def test_paper_a_equals_the_workflow_on_a_trained_model(trained_sort_folder, tmp_path, monkeypatch):
    """The random model's C is 0 everywhere; a trained model's is not."""
    from selfrepair.core import load_hf
    from selfrepair.heroes import causal_importance, gradient_importance
    from selfrepair.tasks import sequences as S

    model = load_hf(trained_sort_folder)
    batches = S.fixed_length_batches("sort", 5, n_batches=3, batch_size=16, seed=23)
    fresh = S.eval_set("sort", 5, 64, seed=37)
    G = gradient_importance(model, batches)
    C = causal_importance(model, fresh, mean_batches=batches)
    assert (C["C"] != 0).any() and (C["baseline_acc"] > 0).all()
    out = heroes_workflow(tmp_path, monkeypatch, trained_sort_folder, batches, fresh)
    assert G.assign(status="kept").to_csv(index=False) == Path(out.gradients).read_text()
    assert C.to_csv(index=False) == Path(out.ablations).read_text()


def test_paper_b_equals_the_workflow(examples, tmp_path, monkeypatch):
    from selfrepair.coax import AMP_EPS

    ns = examples
    truth = tmp_path / "truth.csv"
    pd.DataFrame(
        {
            "unit": ["L1H0", "L0H1", "L0H0", "L1H1"],
            "drop": [1.0, 0.1, 0.0, 0.0],
            "role": ["primary", "backup", "other", "other"],
        }
    ).to_csv(truth, index=False)
    names = ("scores", "discovery", "wake", "freeze", "knockout")
    out = {n: str(tmp_path / f"{n}.csv") for n in names}
    params = SimpleNamespace(
        n_prompts=len(ns["prompts"]), data_seed=1, seed=0, protocol="v2", top_r=192, top_k=20, k_recovered=None,
        wake_min=1.05, ig_steps=5, max_rows=2048, amp_eps=AMP_EPS, **COMPUTE,
    )  # fmt: skip
    run_script(
        "coax_ioi_run",
        monkeypatch,
        input=SimpleNamespace(model=ns["ioi_folder"], truth=str(truth)),
        output=out,
        params=params,
    )
    got = read(out["scores"]).drop(columns=["model_seed", "data_seed", "protocol", "wake", "backup"])
    pd.testing.assert_frame_equal(ns["scores"], got, check_exact=True)


def test_paper_c_equals_the_workflow(examples, tmp_path, monkeypatch):
    from selfrepair.gim import circuit_faithfulness

    ns = examples
    methods = list(ns["summaries"])
    out = SimpleNamespace(
        circuits=str(tmp_path / "circuits"), summary=str(tmp_path / "s.csv"), curves=str(tmp_path / "c.csv")
    )
    params = SimpleNamespace(
        task="ioi", n_eval=len(ns["data"]), data_seed=1, methods=methods, fractions=list(ns["fractions"]),
        batch_size=64, ig_steps=5, weighting="example", tie_orders=0, eactp_max_edges=5000, circuit_fraction=0.1,
        model_name="tiny", seed=0, **COMPUTE,
    )  # fmt: skip
    inp = SimpleNamespace(model=ns["ioi_folder"])
    run_script("gim_localize", monkeypatch, [str(tmp_path / "gim.log")], input=inp, output=out, params=params)
    for m in methods:  # the MIB circuit files, byte for byte
        assert Path(ns["root"], f"{m}.json").read_bytes() == Path(out.circuits, f"{m}.json").read_bytes()
    got = read(out.summary).drop(columns=["task", "model", "seed"])
    pd.testing.assert_frame_equal(pd.DataFrame(list(ns["summaries"].values())), got, check_exact=True)
    curves = read(out.curves)
    mine = curves[curves["method"] == "gim"].drop(columns=["task", "model", "seed"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(ns["curves"], mine, check_exact=True)
    # the circuit read back from its file: f is the absolute curve's point at its fraction
    f = circuit_faithfulness(ns["bridge"], ns["circuit_graph"], ns["data"], ns["in_circuit"])
    point = mine[(mine["ranking"] == "absolute") & (mine["fraction"] == 0.1)]
    assert f["faithfulness"] == point["faithfulness"].item() and f["metric"] == point["metric"].item()


def test_ground_truth_equals_the_workflow(examples, tmp_path, monkeypatch):
    ns = examples
    d = tmp_path / "models" / "tiny"
    out = [str(d / f"{t}.csv") for t in ("shapley", "interactions", "scores", "timing")] + [str(d / "info.json")]
    d.mkdir(parents=True)
    params = SimpleNamespace(
        family="ioi", group="ioi", models=[{"id": "tiny", "model": ns["ioi_folder"]}], mode="zero",
        n_eval=len(ns["prompts"]), data_seed=1, settings={}, **COMPUTE,
    )  # fmt: skip
    run_script("groundtruth_model", monkeypatch, input=SimpleNamespace(), output=out, params=params)
    got = read(d / "shapley.csv").drop(columns=["family", "group", "model", "game", "single"])
    pd.testing.assert_frame_equal(ns["phi"], got, check_exact=True)
