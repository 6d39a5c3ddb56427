"""The document renderer (selfrepair.tooling.readme_table): blocks go into every document
that has them, --check covers them all, and absent models are said once, not per claim."""

from pathlib import Path

import pandas as pd

from selfrepair.tooling import doc_blocks, readme_table

ROOT = Path(__file__).resolve().parents[1]
ABSENT = "weights not found for '{m}' (looked at {m} and the local Hugging Face cache; nothing is downloaded): LocalEntryNotFoundError"


def test_shorten_note_one_model_and_several():
    one = "not run: " + ABSENT.format(m="gpt2") + "; toy analogue: 0.513"
    assert readme_table.shorten_note(one) == "not run: weights of gpt2 absent; toy analogue: 0.513"
    many = "not run: " + "; ".join(f"{m}: " + ABSENT.format(m=m) for m in ("gpt2", "gpt2-medium", "org/x-1.3B"))
    assert readme_table.shorten_note(many) == "not run: weights of gpt2, gpt2-medium, org/x-1.3B absent"
    assert readme_table.shorten_note("10 seeds with bloats") == "10 seeds with bloats"


def test_absent_models_listed_once_above_the_table(tmp_path):
    notes = [
        "not run: " + ABSENT.format(m="gpt2") + "; toy analogue: 1",
        "not run: " + ABSENT.format(m="gpt2"),
        "not run: " + "; ".join(f"{m}: " + ABSENT.format(m=m) for m in ("gpt2", "gpt2-large")),
        "40 trials",
    ]
    df = pd.DataFrame(
        {
            "paper": ["coax"] * 4,
            "id": list("abcd"),
            "claim": list("abcd"),
            "published": [1, 2, 3, 4],
            "reproduced": [None, None, None, 4],
            "tolerance": [0.1] * 4,
            "status": ["not run"] * 3 + ["reproduced"],
            "note": notes,
        }
    )
    f = tmp_path / "p.csv"
    df.to_csv(f, index=False)
    md = readme_table.published_markdown(f)
    assert md.count("LocalEntryNotFoundError") == 1  # one reason, said once
    assert "`gpt2` (3 claims), `gpt2-large` (1 claim)" in md
    rows = [line for line in md.splitlines() if line.startswith("| coax")]
    assert len(rows) == 4 and not any("weights not found" in r for r in rows)
    assert "not run: weights of gpt2, gpt2-large absent" in rows[2]


def test_reference_published_table_says_each_absent_model_once():
    md = readme_table.blocks()["published"]
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert not any("LocalEntryNotFoundError" in r or "weights not found" in r for r in table)
    head = md.split("\n| paper |")[0]
    for m in ("gpt2", "gpt2-medium", "gpt2-large", "meta-llama/Llama-3.1-8B"):
        assert head.count(f"`{m}`") == 1, m


def test_headline_one_row_per_paper_counts_every_claim():
    df = pd.read_csv(readme_table.REFERENCE / "published_summary.csv")
    md = readme_table.blocks()["headline"]
    rows = [line.split(" | ") for line in md.splitlines()[2:]]
    papers = [p for p in dict.fromkeys(df["paper"]) if p in readme_table.PAPERS]  # papers only
    for paper in papers:
        g = df[df["paper"] == paper]
        mine = [r for r in rows if r[0].startswith("| " + readme_table.PAPERS[paper])]
        # one row per protocol: two for paper A where the authors'-code columns are filled
        two = "authors_status" in g and (g["authors_status"].fillna("not run") != "not run").any()
        assert len(mine) == (2 if two else 1), paper
        for r in mine:
            assert int(r[1]) == len(g) == sum(int(x) for x in r[2:6])
    # the rest: one row per real LM of the real-LM claims table, counting its claims
    others = [r for r in rows if not any(r[0].startswith("| " + readme_table.PAPERS[p]) for p in papers)]
    lms = readme_table.REFERENCE / "real_lms_claims.csv"
    real = pd.read_csv(lms) if lms.exists() else pd.DataFrame({"model": []})
    assert len(others) == real["model"].nunique()
    for r, (model, g) in zip(others, real.groupby("model", sort=False)):
        assert "real LM" in r[0] and int(r[1]) == len(g) == sum(int(x) for x in r[2:6]), model


def test_blocks_rendered_into_every_document_and_checked(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    empty = "<!-- headline:start -->\n<!-- headline:end -->\n"
    (tmp_path / "README.md").write_text("# r\n\n" + empty)
    (tmp_path / "docs" / "R.md").write_text(
        "quoted `<!-- name:start -->` is no marker\n\n"
        + empty
        + "\n<!-- runtime:start -->\nold\n<!-- runtime:end -->\n"
    )
    assert readme_table.main(["--check"], root=tmp_path) == 1
    out = capsys.readouterr().out
    assert "README.md is out of date" in out and "docs/R.md is out of date" in out
    assert readme_table.main([], root=tmp_path) == 0
    assert readme_table.main(["--check"], root=tmp_path) == 0
    parts = readme_table.blocks()
    for doc in (tmp_path / "README.md", tmp_path / "docs" / "R.md"):
        assert parts["headline"] in doc.read_text()
    assert parts["runtime"] in (tmp_path / "docs" / "R.md").read_text()
    (tmp_path / "docs" / "R.md").write_text("<!-- nosuch:start -->\n<!-- nosuch:end -->\n<!-- runtime:start -->\n")
    assert readme_table.main(["--check"], root=tmp_path) == 1
    out = capsys.readouterr().out
    assert "unknown block 'nosuch'" in out and "block 'runtime' needs exactly one start and one end marker" in out


def test_every_reference_table_is_in_a_document_and_readme_stays_short():
    docs = {d.relative_to(ROOT).as_posix(): d.read_text() for d in readme_table.documents()}
    names = {n: [d for d, t in docs.items() if n in readme_table.block_names(t)] for n in readme_table.blocks()}
    assert all(names.values()), [n for n, d in names.items() if not d]
    assert readme_table.block_names(docs["README.md"]) == ["headline"]  # the long tables live in docs/


def test_documents_in_docs_subfolders_are_rendered_and_checked(tmp_path, capsys):
    """docs/results/*.md and deeper: found, rendered, and --check fails while one is stale."""
    (tmp_path / "docs" / "results" / "deep").mkdir(parents=True)
    (tmp_path / "README.md").write_text("# r\n")
    sub = tmp_path / "docs" / "results" / "deep" / "page.md"
    sub.write_text("<!-- verdict_gim:start -->\n<!-- verdict_gim:end -->\n")
    assert sub in readme_table.documents(tmp_path)
    assert readme_table.main(["--check"], root=tmp_path) == 1
    assert "docs/results/deep/page.md is out of date" in capsys.readouterr().out
    assert readme_table.main([], root=tmp_path) == 0
    assert readme_table.blocks()["verdict_gim"] in sub.read_text()


def test_verdict_counts_and_rows_worked_out_by_hand():
    """Two protocols: counts per status for each, and a row for every claim that differs or
    is fragile under either; one protocol without such a claim: counts and one sentence."""
    df = pd.DataFrame(
        {
            "paper": ["heroes"] * 4 + ["coax"] * 2,
            "id": ["a", "b", "c", "d", "e", "f"],
            "published": [0.72, 21, 5, "holds", 0.9, 1],
            "reproduced": [0.585, 5, 5, "does not hold", 0.92, None],
            "ci_low": [0.46, 1, None, None, None, None],
            "ci_high": [0.7, 10, None, None, None, None],
            "tolerance": [0.08, 5, 1, None, 0.03, 0.1],
            "status": ["fragile", "differs", "reproduced", "differs", "reproduced", "not run"],
            "authors_reproduced": [0.81, 16, 5, None, None, None],
            "authors_ci_low": [None] * 6,
            "authors_ci_high": [None] * 6,
            "authors_status": ["fragile", "reproduced", "reproduced", None, None, None],
        }
    )
    md = doc_blocks.verdict_markdown(df, "heroes")
    assert md.startswith(
        "4 claims. Under the paper's text: 1 reproduced, 1 fragile, 2 differ, 0 not run. "
        "Under the authors' code: 2 reproduced, 1 fragile, 0 differ, 1 not run."
    )
    rows = [line for line in md.splitlines() if line.startswith("| `")]
    assert rows == [
        "| `a` | 0.72 +- 0.08 | 0.585 [0.46, 0.7] | fragile | 0.81 | fragile |",
        "| `b` | 21 +- 5 | 5 [1, 10] | differs | 16 | reproduced |",
        "| `d` | holds | does not hold | differs |  | not run |",
    ]
    assert doc_blocks.verdict_markdown(df, "coax") == (
        "2 claims. 1 reproduced, 0 fragile, 0 differ, 1 not run. No claim that ran differs from the published value."
    )


def test_not_run_grouped_by_need_worked_out_by_hand():
    """Six not-run claims: two need only gpt2's weights, one MIB's models and data, two an
    experiment this workflow lacks (one of them also names gpt2: it stays in the code
    group), one ran with an undefined value; the reproduced one is left out. Costs: the
    stand-ins' projected hours, MIB's summed per model without EActP."""
    gone = "weights not found for 'gpt2' (looked at gpt2 and the local Hugging Face cache)"
    df = pd.DataFrame(
        {
            "paper": ["coax", "coax", "coax", "coax", "gim", "heroes", "coax"],
            "status": ["not run"] * 6 + ["reproduced"],
            "note": [
                f"not run: {gone}; toy analogue: 1.0",
                f"not run: {gone}",
                f"not run: {gone}; no toy analogue: the knockout table records no KL",
                "not run: needs pythia-160m weights and the release's held-out induction completion",
                "MIB models/datasets are not in the local cache, so the claim about them is not run",
                "undefined: the mean individual drop is -0.16 points",
                "40 trials",
            ],
        }
    )
    real = pd.DataFrame(
        {
            "model": ["gpt2"] * 5,
            "part": ["ioi", "wakeup", "mib:eap", "mib:gim", "mib:eactp"],
            "hours_config_projected": [2.0, 0.5, 0.1, 0.2, 100.0],
            "weights_gb_fp32": [0.5] * 5,
        }
    )
    g = doc_blocks.not_run_groups(df)
    assert list(zip(g["kind"], g["claims"])) == [("weights", 2), ("mib", 1), ("code", 1), ("code", 1), ("undefined", 1)]
    assert g["what"][0] == ("gpt2",)
    md = doc_blocks.not_run_markdown(df, real).splitlines()
    assert md[0] == "6 claims are *not run* (paper A 1, paper B 4, paper C 1). By what they need:"
    assert md[4] == (
        "| weights of `gpt2` | 2 | B | `snakemake --cores all results/published/coax.csv` "
        "| `gpt2` ioi 2 h, wakeup 0.5 h (0.5 GB fp32) |"
    )
    assert md[5].endswith("| 1 | C | `snakemake --cores all results/published/gim.csv` | `gpt2` 0.3 h (0.5 GB fp32) |")
    assert md[6].endswith("not implemented here | 1 | B |  |  |") and "knockout" in md[6]


def test_reference_not_run_claims_each_in_one_group():
    """Every not-run claim of the reference summary falls in a named group (none unread)."""
    df = pd.read_csv(readme_table.REFERENCE / "published_summary.csv")
    g = doc_blocks.not_run_groups(df)
    assert g["claims"].sum() == (df["status"].fillna("not run") == "not run").sum()
    assert "other" not in set(g["kind"]), g[g["kind"] == "other"]
