#!/usr/bin/env bash
# Stand-in for sacct: running / success / failed for a job id from submit.sh.
rc=.snakemake/local-cluster/$1.rc
if [ ! -f "$rc" ]; then echo running; elif [ "$(cat "$rc")" = 0 ]; then echo success; else echo failed; fi
