"""Edge scores of every method, MIB circuit files, and faithfulness curves (thin adapter)."""

import json
import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")  # noqa: F821
import pandas as pd  # noqa: E402

from selfrepair.core import runtime  # noqa: E402
from selfrepair.core.models import load_bridge, resolve_device  # noqa: E402
from selfrepair.gim.attribute import too_large  # noqa: E402
from selfrepair.gim.graph import Graph, n_edges_at, save_mib_json, select_edges, selection_rule  # noqa: E402
from selfrepair.gim.localization import localize  # noqa: E402
from selfrepair.tasks.registry import get_task  # noqa: E402

runtime.compute_setup(snakemake)  # noqa: F821  numerics mode, threads
p = snakemake.params  # noqa: F821
out = snakemake.output  # noqa: F821
bridge = load_bridge(snakemake.input.model, resolve_device(p.device))  # noqa: F821
data = get_task(p.task).sample(int(p.n_eval), seed=int(p.data_seed))
Path(out.circuits).mkdir(parents=True, exist_ok=True)
summaries, curves = [], []
n_edges = Graph.from_bridge(bridge).n_edges
for method in p.methods:
    if why := too_large(method, n_edges, int(p.eactp_max_edges)):
        print(why, file=sys.stderr, flush=True)
        continue
    graph, scores, curve, summary = localize(
        bridge,
        data,
        method,
        tuple(p.fractions),
        int(p.batch_size),
        int(p.ig_steps),
        str(p.weighting),
        int(p.tie_orders),
    )
    # the circuit file holds MIB's circuit at circuit_fraction: int(f * n) edges by |score|, chosen
    # by the method's rule (top-n; greedy from the logits for ifr), pruned
    n_circuit = n_edges_at(p.circuit_fraction, graph.n_edges)
    mask = select_edges(graph, scores, n_circuit, True, selection_rule(method))
    save_mib_json(Path(out.circuits) / f"{method}.json", graph, scores, mask)
    summaries.append({"task": p.task, "model": p.model_name, "seed": int(p.seed), **summary})
    curves.append(curve.assign(task=p.task, model=p.model_name, seed=int(p.seed)))
    print(json.dumps(summaries[-1]), file=sys.stderr, flush=True)
pd.DataFrame(summaries).to_csv(out.summary, index=False)
pd.concat(curves).to_csv(out.curves, index=False)
