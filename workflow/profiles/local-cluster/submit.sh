#!/usr/bin/env bash
# Stand-in for sbatch: run the job script in the background, print a job id.
# The job's exit code lands in .snakemake/local-cluster/<id>.rc for status.sh.
set -euo pipefail
dir=.snakemake/local-cluster
mkdir -p "$dir"
id="$(date +%s%N)$$"
( bash "$1" > "$dir/$id.out" 2>&1; echo $? > "$dir/$id.rc" ) &
echo "$id"
