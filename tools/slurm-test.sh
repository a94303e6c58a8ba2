#!/usr/bin/env bash
# Integration test of split runs on a real Slurm: installs Debian's Slurm
# (slurmctld, slurmd, the client commands) and munge, starts munged,
# slurmctld and slurmd on this machine as a one-node cluster, submits the
# parts of `ctquant quantize` as a job array and `ctquant finalize` as a job
# that depends on it (the workflow of docs/scale-out.md), and checks that
# the output is byte-identical to a one-process run. Cases: the sharded
# golden case (2 shards), and a 20-shard synthetic checkpoint (tests/layouts).
# Everything it starts is stopped at the end, by process id.
#
#   tools/slurm-test.sh [--parts N] [--keep]
#
#   --parts N   parts per run (default 3; a case of fewer shards is split in
#               as many parts as it has shards: a part writes whole shards)
#   --keep      keep the work directory (logs, outputs) for inspection
#
# Runs as root (through sudo when started by another user): it installs
# packages and starts the daemons. Exit status 0 when every case matched.
set -euo pipefail
cd "$(dirname "$0")/.."

PARTS=3
KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --parts) PARTS=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "slurm-test: unknown option $1" >&2; exit 2 ;;
  esac
done
say() { echo "slurm-test: $*" >&2; }
die() { say "$*"; exit 1; }
# Root installs Slurm and starts its daemons.
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || die "run as root (or with sudo): it installs Slurm and starts its daemons"
  exec sudo -E bash "$0" "$@"
fi

# ---- packages and the binaries under test ----
missing=()
for p in slurmctld slurmd slurm-client munge; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi
# The build of tools/dev.sh (reused as it is when it exists, as in .ci/run).
BUILD_DIR=${CTQUANT_BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCTQUANT_WERROR=ON \
    -DCTQUANT_BUILD_BENCHMARKS=ON >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$(nproc)" --target ctquant ctquant_make_checkpoint >/dev/null
CTQUANT=$(realpath "$BUILD_DIR/ctquant")
GENERATE=$(realpath "$BUILD_DIR/tools/ctquant_make_checkpoint")

WORK=$(mktemp -d /tmp/ctquant-slurm.XXXXXX)
chmod 755 "$WORK"
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done
  if [ "$KEEP" = 1 ]; then say "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# ---- munge: its own key, socket and state under $WORK ----
M=$WORK/munge
mkdir -p "$M/etc" "$M/run" "$M/lib" "$M/log"
dd if=/dev/urandom of="$M/etc/munge.key" bs=1024 count=1 status=none
chown -R munge:munge "$M"
chmod 700 "$M/etc" "$M/lib" "$M/log"
chmod 755 "$M/run"
chmod 400 "$M/etc/munge.key"
MUNGE_SOCKET=$M/run/munge.socket.2
runuser -u munge -- /usr/sbin/munged --key-file="$M/etc/munge.key" --socket="$MUNGE_SOCKET" \
  --pid-file="$M/run/munged.pid" --log-file="$M/log/munged.log" --seed-file="$M/lib/munged.seed"
for _ in $(seq 100); do [ -s "$M/run/munged.pid" ] && break; sleep 0.1; done
[ -s "$M/run/munged.pid" ] || die "munged did not start (see $M/log/munged.log)"
PIDS+=("$(cat "$M/run/munged.pid")")
munge --socket="$MUNGE_SOCKET" -n | unmunge --socket="$MUNGE_SOCKET" >/dev/null ||
  die "munge cannot encode and decode a credential"

# ---- Slurm: a one-node cluster on this machine ----
S=$WORK/slurm
mkdir -p "$S/state" "$S/spool"
NODE=$(hostname -s)
MEM_MB=$(awk '/MemTotal/ { printf "%d", $2 / 1024 / 2 }' /proc/meminfo)
export SLURM_CONF=$S/slurm.conf
cat >"$SLURM_CONF" <<EOF
ClusterName=ctquant-test
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
SlurmctldPort=16817
SlurmdPort=16818
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmctldLogFile=$S/slurmctld.log
SlurmdLogFile=$S/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
NodeName=$NODE CPUs=$(nproc) RealMemory=$MEM_MB State=UNKNOWN
PartitionName=ctquant Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
/usr/sbin/slurmctld -c -f "$SLURM_CONF"
for _ in $(seq 100); do [ -s "$S/slurmctld.pid" ] && break; sleep 0.1; done
[ -s "$S/slurmctld.pid" ] || die "slurmctld did not start (see $S/slurmctld.log)"
PIDS+=("$(cat "$S/slurmctld.pid")")
/usr/sbin/slurmd -f "$SLURM_CONF"
for _ in $(seq 100); do [ -s "$S/slurmd.pid" ] && break; sleep 0.1; done
[ -s "$S/slurmd.pid" ] || die "slurmd did not start (see $S/slurmd.log)"
PIDS+=("$(cat "$S/slurmd.pid")")
for _ in $(seq 300); do
  state=$(sinfo -h -n "$NODE" -o '%t' 2>/dev/null || true)
  case "$state" in idle|mix|alloc) break ;; esac
  sleep 0.2
done
case "$state" in idle|mix|alloc) ;; *) die "node $NODE is '$state', not idle (see $S/slurmd.log, $S/slurmctld.log)" ;; esac
say "Slurm is up: node $NODE ($(nproc) CPUs), partition ctquant"

# ---- the cases ----
# run_case NAME INPUT [quantize options...]: the parts as a job array, then
# finalize as a job that depends on it, then byte comparison against one
# process.
status=0
run_case() {
  local name=$1 input=$2; shift 2
  local dir=$WORK/$name
  mkdir -p "$dir"
  "$CTQUANT" quantize "$input" "$dir/one" "$@" -q
  local args=""
  for a in "$@"; do args+=" '$a'"; done
  local shards parts=$PARTS
  shards=$(find "$input" -maxdepth 1 -name '*.safetensors' | wc -l)
  [ "$parts" -le "$shards" ] || parts=$shards
  local array
  array=$(sbatch --parsable --array="1-$parts" --cpus-per-task=1 --output="$dir/part-%a.log" \
    --job-name="$name-parts" --wrap \
    "'$CTQUANT' quantize '$input' '$dir/out' --part \$SLURM_ARRAY_TASK_ID/\$SLURM_ARRAY_TASK_COUNT$args")
  local final
  final=$(sbatch --parsable --wait --dependency="afterok:$array" --kill-on-invalid-dep=yes \
    --output="$dir/finalize.log" --job-name="$name-finalize" --wrap "'$CTQUANT' finalize '$dir/out'") ||
    { say "$name: finalize job failed"; cat "$dir"/*.log >&2; status=1; return; }
  if diff -r "$dir/one" "$dir/out" >&2; then
    say "$name: $parts parts (job array $array) + finalize (job $final): byte-identical to one process"
  else
    say "$name: output DIFFERS from one process"; status=1
  fi
}

run_case dflash-bf16-sharded "$(realpath tests/golden/dflash-bf16-sharded/input)" \
  --ignore 're:.*qkv_proj$' --ignore 're:.*g_proj$'
"$GENERATE" tests/layouts/llama-20-shards.manifest.json "$WORK/synthetic" --seed 7 \
  --shard-size 7500000 2>/dev/null
run_case synthetic-20-shards "$WORK/synthetic"
exit $status
