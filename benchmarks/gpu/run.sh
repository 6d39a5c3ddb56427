#!/usr/bin/env bash
# The workflow on one GPU in one call of under 10 minutes (details: gpu_bench.py).
#   bash benchmarks/gpu/run.sh prepare     here, online: pip puts the wheels into benchmarks/gpu/wheels/
#                                          (pip runs under a Python 3.12: PYTHON312 if not on PATH)
#   bash benchmarks/gpu/run.sh --dry-run   here, no GPU: pip checks the wheels offline; the steps
#   bash benchmarks/gpu/run.sh             on the GPU machine (benchmarks/gpu/wheels/ carried):
#                                          $OUT/gpu_run.csv; BUDGET=seconds (default 530)
# PYTHON: the interpreter (here: the project's, default .venv/bin/python; there: python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-run}" in
  prepare) exec "${PYTHON:-.venv/bin/python}" benchmarks/gpu/gpu_bench.py prepare ;;
  --dry-run) exec "${PYTHON:-.venv/bin/python}" benchmarks/gpu/gpu_bench.py check ;;
  run)
    : "${OUT:?set OUT to the folder whose files come back}"
    exec "${PYTHON:-python3}" benchmarks/gpu/gpu_bench.py run --out "$OUT" --budget "${BUDGET:-530}" ;;
  *) echo "usage: bash benchmarks/gpu/run.sh [prepare | --dry-run]" >&2; exit 2 ;;
esac
