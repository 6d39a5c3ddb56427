#!/usr/bin/env bash
# A real single-node SLURM on this machine, for tests/test_slurm.py (and for trying
# workflow/profiles/slurm by hand). Debian's SLURM (22.05) and munge, run as root:
#
#   tests/cluster/start-slurm.sh         install the packages if missing, write
#                                        /etc/slurm/slurm.conf, start munged, slurmctld
#                                        and slurmd, wait until the node is idle
#   tests/cluster/start-slurm.sh stop    stop the three daemons (by their pid files)
#
# The cluster: one node with this machine's CPUs and memory (as `slurmd -C` reports
# them), one CPU-only partition `cpu` (the default), no accounting (no slurmdbd: poll
# with `--slurm-status-command squeue`), MinJobAge long enough for squeue to still show
# a finished job. Starting an already running cluster only waits for the node.
set -euo pipefail

CONF=/etc/slurm/slurm.conf
MARK="# Written by tests/cluster/start-slurm.sh (selfrepair): a one-node test cluster."
PIDS=(/run/slurmd.pid /run/slurmctld.pid /run/munge/munged.pid)
LOGS=/var/log/slurm
WAIT_S=${SLURM_START_WAIT_S:-90}

die() { echo "start-slurm.sh: $*" >&2; exit 1; }
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

[ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts SLURM's daemons as root)"

stop() {
  for f in "${PIDS[@]}"; do
    if alive "$f"; then
      pid=$(cat "$f")
      kill "$pid"
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      kill -0 "$pid" 2>/dev/null && die "pid $pid (from $f) did not stop within 10 s"
      echo "stopped pid $pid ($f)"
    fi
    rm -f "$f"
  done
}

if [ "${1:-start}" = stop ]; then stop; exit 0; fi
[ "${1:-start}" = start ] || die "usage: $0 [start|stop]"

# 1. The packages (about 1 min on a fresh Debian 12).
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
   || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  pkgs=(slurmctld slurmd slurm-client munge)
  apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null; } \
    || die "could not install ${pkgs[*]} with apt-get"
fi

# 2. slurm.conf: never over a configuration this script did not write.
if [ -f "$CONF" ] && ! grep -qxF "$MARK" "$CONF"; then
  die "$CONF exists and was not written by this script: not overwriting a real cluster's configuration"
fi
host=$(hostname -s)
node=$(slurmd -C | head -n 1)  # NodeName=<host> CPUs=.. Boards=.. ... RealMemory=..
[[ "$node" == "NodeName=$host "* ]] || die "unexpected \`slurmd -C\` output: $node"
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd "$LOGS"
cat > "$CONF.new" <<EOF
$MARK
ClusterName=selfrepair-test
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
# squeue shows a finished job this long (s): the SLURM executor's squeue polling needs
# at least 3 x its first status-check interval.
MinJobAge=3600
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=cpu Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
if ! cmp -s "$CONF.new" "$CONF" 2>/dev/null && alive /run/slurmctld.pid; then
  echo "slurm.conf changed: restarting the cluster"
  stop
fi
mv "$CONF.new" "$CONF"

# 3. The daemons, each unless already running.
if ! alive /run/munge/munged.pid; then
  mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
  [ -s /etc/munge/munge.key ] || { mungekey --create --keyfile /etc/munge/munge.key; chown munge:munge /etc/munge/munge.key; }
  runuser -u munge -- /usr/sbin/munged
fi
munge -n | unmunge >/dev/null || die "munge does not work (log: /var/log/munge/munged.log)"
if ! alive /run/slurmctld.pid; then
  slurmctld -c  # -c: a fresh cluster, no jobs kept from an earlier one
fi
if ! alive /run/slurmd.pid; then
  slurmd
fi

# 4. Wait for the node.
for _ in $(seq "$WAIT_S"); do
  state=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
  if [[ "$state" =~ ^(idle|mixed|allocated)$ ]]; then  # up (busy: already running jobs)
    sinfo
    exit 0
  fi
  sleep 1
done
echo "start-slurm.sh: node $host not idle after $WAIT_S s (state: ${state:-none}); logs:" >&2
tail -n 20 "$LOGS/slurmctld.log" "$LOGS/slurmd.log" >&2 || true
exit 1
