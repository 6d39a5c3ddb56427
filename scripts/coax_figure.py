"""Rule coax_fig: draw one paper-B figure from its table (nothing is computed here)."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from selfrepair.coax import claims  # noqa: E402
from selfrepair.core import published, runtime  # noqa: E402

smk = snakemake  # noqa: F821
runtime.start(smk)
runtime.check_inputs(smk)  # TableChanged on a table not as its rule wrote it
kind = smk.params.figure
t = {k: pd.read_csv(v) for k, v in smk.input.items() if k != "claims"}
# published values: config/published.yaml (the paper's and the authors' release 2.1.0's)
pub = {c["id"]: c.get("value") for c in published.load_claims(smk.input["claims"], "coax")}
PUB_SYN = {s: pub[f"synthetic_{s}_auc"] for s in ("clean_energy", "clean_answer", "cond_answer", "coax")}
# GPT-2 small IOI: the paper's ioi_auc_* and the release's ioi_auc_*_r21 (its AtP, which
# averages magnitudes, is our atp_mag: claims.IOI_AUC_CLAIMS maps claims to methods)
PUB_IOI = {m: pub[c] for c, m in claims.IOI_AUC_CLAIMS.items() if not c.endswith("_r21")}
REL_IOI = {m: pub[c] for c, m in claims.IOI_AUC_CLAIMS.items() if c.endswith("_r21")}
PUB_WAKE = [pub[f"wakeup_ratio_{k}"] for k in range(4)]
IOI_ORDER = ["single", "atp", "atp_mag", "eap_ig", "atp_star", "atp_star_2s", "cond_grad", "atp_2s", "amp_ratio"]
IOI_ORDER += ["coax"]
fig, ax = plt.subplots(figsize=(6, 4))
if kind == "synthetic":
    d = t["synthetic"]
    order = list(PUB_SYN)
    ax.boxplot([d[d.score == s]["auc"] for s in order], tick_labels=order)
    for i, s in enumerate(order, 1):
        ax.hlines(PUB_SYN[s], i - 0.3, i + 0.3, colors="C3", linestyles="--")
    ax.set_ylabel("ROC-AUC (backups vs inert)")
    ax.set_title("Synthetic benchmark (dashed: published)")
elif kind == "discovery":
    d, mean = t["discovery"], t["summary"].set_index("method")["roc_auc"]  # ioi_summary: the mean per method
    order = [m for m in IOI_ORDER if m in set(d.method)]
    labelled: set = set()

    def once(label):  # one legend entry per mark
        new = label not in labelled
        labelled.add(label)
        return label if new else None

    for i, m in enumerate(order):
        v = d[d.method == m]["roc_auc"]
        ax.scatter([i] * len(v), v, alpha=0.6, color="C0", label=once("one (model, prompt set)"))
        if m in mean:
            ax.hlines(mean[m], i - 0.3, i + 0.3, color="C0", label=once("mean over (model, prompt set)"))
        if m in PUB_IOI:
            ax.scatter([i], [PUB_IOI[m]], marker="x", color="C3", label=once("paper (GPT-2 small)"))
        if m in REL_IOI:
            ax.scatter([i], [REL_IOI[m]], marker="+", s=70, color="C2", label=once("release 2.1.0 (GPT-2 small)"))
    ax.set_xticks(range(len(order)), order, rotation=30, ha="right")
    ax.axhline(0.5, color="grey", lw=0.5, label="chance (0.5)")
    ax.set_ylabel("backup-discovery ROC-AUC")
    ax.set_title("Backup discovery on the toy IOI models")
    ax.legend(fontsize=7, loc="best", framealpha=0.8)
elif kind == "wakeup":
    d = t["wake"]
    for g, sub in d.groupby("group"):
        m = sub.groupby("n_ablated")["ratio"].mean()
        ax.plot(m.index, m.values, marker="o", label=g)
    ax.plot(range(len(PUB_WAKE)), PUB_WAKE, "k--", label="published backups (GPT-2)")
    ax.set_xlabel("primaries ablated")
    ax.set_ylabel("output-norm ratio")
    ax.legend()
elif kind == "knockout":
    d = t["knockout"].groupby("set", sort=False)[["drop", "accuracy"]].mean()
    ax.bar(range(len(d)), d["accuracy"], color="C0", label="accuracy")
    ax2 = ax.twinx()
    ax2.plot(range(len(d)), d["drop"], "o-", color="C3", label="logit-diff drop")
    ax.set_xticks(range(len(d)), d.index, rotation=20, ha="right")
    ax.set_ylabel("IOI accuracy")
    ax2.set_ylabel("logit-difference drop")
    ax.set_title("Attribution recovery and knockout (toy IOI)")
elif kind == "induction":
    d = t["induction"]
    for m, sub in d.groupby("model"):
        ax.plot(sub["k"], sub["ratio_alone"], marker="o", label=m)
        deg = sub[sub.degenerate]
        ax.scatter(deg["k"], deg["ratio_alone"], marker="s", facecolors="none", edgecolors="k")
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_xlabel("k")
    ax.set_ylabel("drop(COAX set) / mean drop(random sets)")
    ax.legend(fontsize=7)
elif kind == "pruning":
    d = t["pruning"]
    for m, sub in d.groupby("method"):
        ax.plot(sub["sparsity"], sub["perplexity"], marker="o", label=m)
    ax.set_yscale("log")
    ax.set_xlabel("head sparsity")
    ax.set_ylabel("perplexity")
    ax.legend()
else:
    raise ValueError(f"unknown figure {kind!r}")
fig.tight_layout()
for path in smk.output:  # no creation date in a PDF (as core/plots.save): same table, same bytes
    fig.savefig(path, dpi=120, metadata={"CreationDate": None} if str(path).endswith(".pdf") else None)
