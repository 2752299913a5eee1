#!/usr/bin/env bash
# A throwaway single-node Slurm cluster for tests: munged, slurmctld and slurmd started as root
# with their own key, socket, slurm.conf, ports, state and logs in one temporary folder, and
# stopped again with every process they started (jobs included).
#
# Sourced by a test (bash):
#   source tests/slurm/slurm_cluster.sh
#   slurm_cluster_start [CPUS]   # sets SLURM_CLUSTER_DIR, exports SLURM_CONF; a trap stops it on exit
#   slurm_cluster_start CPUS N   # N nodes (node0 ... ) made by tests/common/nodes.sh's nodes_start N
#                                # first: slurmctld on node0, a slurmd per node in its namespaces
#                                # (its hostname the node's), the client commands (sinfo, sbatch,
#                                # squeue, scontrol, scancel) run on node0 through shell functions
#   sbatch ...; slurm_job_wait JOBID 60; slurm_job_field JOBID JobState
#   slurm_cluster_stop           # idempotent; also run by the trap (EXIT, INT, TERM, HUP)
# By hand (the same functions; the cluster lives until `stop`):
#   tests/slurm/slurm_cluster.sh start [CPUS]   # prints the export line for SLURM_CONF
#   tests/slurm/slurm_cluster.sh stop DIR
#
# Works without systemd and without cgroups (proctrack/linuxproc, task/none), on a VM with fewer
# cores than tasks (the node advertises CPUS, default 4, and slurmd accepts the overstatement).
# Never touches /etc/munge, /etc/slurm or the system daemons; talks to its own munged only.
# Every wait is bounded and says what it waited for when it gives up.

# A command's output or a log's tail, for error messages.
_slurm_tail() { [ -f "$1" ] && { echo "---- last lines of $1"; tail -n "${2:-20}" "$1"; echo "----"; }; }
_slurm_say() { printf '[slurm-cluster %5.1fs] %s\n' "$(_slurm_elapsed)" "$*" >&2; }
_slurm_elapsed() { echo "$(( $(date +%s%N) / 1000000 - ${_SLURM_T0_MS:-$(( $(date +%s%N) / 1000000 ))} ))" | awk '{printf "%.1f", $1 / 1000}'; }

# A TCP port that nothing listens on (random in 20000-59999; collisions are re-drawn).
_slurm_free_port() {
  local p _
  for _ in $(seq 1 50); do
    p=$(( 20000 + (RANDOM * 32768 + RANDOM) % 40000 ))
    if command -v ss >/dev/null; then
      [ -z "$(ss -Hltn "sport = :$p" 2>/dev/null)" ] && { echo "$p"; return 0; }
    else  # no iproute2: a port nothing accepts connections on
      (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
    fi
  done
  echo "slurm_cluster: no free TCP port found" >&2; return 1
}

# Waits up to $1 seconds for the command "$2..." to succeed (polled every 0.2 s). Arguments are
# expanded once, by the caller: wrap a condition with $(...) in eval '...'.
_slurm_wait_for() {
  local limit=$1; shift
  local end=$(( $(date +%s) + limit ))
  while ! "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -ge "$end" ] && return 1
    sleep 0.2
  done
}

# True while process $1 exists and is not a zombie.
_slurm_alive() { [ -r "/proc/$1/stat" ] && ! grep -q '^[0-9]* (.*) Z ' "/proc/$1/stat" 2>/dev/null; }

# True when process $1 is this shell, descends from it (our own helpers carry the tag as well) or
# is one of its ancestors (a shell that exported the tag and runs `stop`).
_slurm_ours() {
  local p=$1 _
  for _ in $(seq 1 64); do
    [ "$p" = "$$" ] && return 0
    p=$(awk '/^PPid:/ {print $2}' "/proc/$p/status" 2>/dev/null)
    [ -n "$p" ] && [ "$p" -gt 1 ] || break
  done
  p=$$
  for _ in $(seq 1 64); do
    p=$(awk '/^PPid:/ {print $2}' "/proc/$p/status" 2>/dev/null)
    [ -n "$p" ] && [ "$p" -gt 1 ] || return 1
    [ "$p" = "$1" ] && return 0
  done
  return 1
}

# The PIDs of every process whose environment carries this cluster's tag, except this shell's
# own descendants: every slurmstepd (it inherits slurmd's environment; it detaches from slurmd)
# and the jobs' tasks (sbatch exports the submitter's environment, which has the tag too).
_slurm_tagged_pids() {
  local f pid
  for f in $(grep -lzx "DLO_SLURM_CLUSTER_TAG=$DLO_SLURM_CLUSTER_TAG" /proc/[0-9]*/environ 2>/dev/null); do
    pid=${f#/proc/}; pid=${pid%/environ}
    # Processes that have exited since (grep itself, our short-lived helpers) are not leftovers.
    _slurm_ours "$pid" || { _slurm_alive "$pid" && echo "$pid"; }
  done
  return 0
}

slurm_cluster_start() {
  local cpus=${1:-4} nodes=${2:-1}
  _SLURM_T0_MS=$(( $(date +%s%N) / 1000000 ))
  local bin
  for bin in munged mungekey slurmctld slurmd sinfo sbatch squeue scontrol scancel srun; do
    command -v "$bin" >/dev/null || { echo "slurm_cluster: $bin not found (tools/setup.sh installs slurmctld slurmd slurm-client munge)" >&2; return 1; }
  done
  [ "$(id -u)" -eq 0 ] || { echo "slurm_cluster: must run as root (slurmd launches jobs as their user)" >&2; return 1; }

  SLURM_CLUSTER_DIR=$(mktemp -d /tmp/dlo-slurm.XXXXXX)
  local d=$SLURM_CLUSTER_DIR
  # The tag marks every process of this cluster (see _slurm_tagged_pids); export it so the
  # jobs submitted from this shell carry it as well.
  export DLO_SLURM_CLUSTER_TAG=${d##*/}
  trap 'slurm_cluster_stop' EXIT
  trap 'slurm_cluster_stop; exit 130' INT
  trap 'slurm_cluster_stop; exit 143' TERM HUP
  mkdir -p "$d/munge" "$d/state" "$d/spool" "$d/log"
  chmod 700 "$d/munge"

  # 1. munged with its own key and socket.
  mungekey --create --keyfile="$d/munge/munge.key" --bits=1024 >/dev/null 2>"$d/log/mungekey.log" \
    || { _slurm_tail "$d/log/mungekey.log"; return 1; }
  chmod 600 "$d/munge/munge.key"
  munged --foreground --force --key-file="$d/munge/munge.key" --socket="$d/munge/munge.socket" \
    --pid-file="$d/munge/munged.pid" --seed-file="$d/munge/munged.seed" --log-file="$d/log/munged.log" \
    >"$d/log/munged.out" 2>&1 &
  echo $! > "$d/munged.pid"
  _slurm_wait_for 10 test -S "$d/munge/munge.socket" \
    || { echo "slurm_cluster: munged did not create its socket within 10 s" >&2; _slurm_tail "$d/log/munged.out"; _slurm_tail "$d/log/munged.log"; return 1; }

  # 2. slurm.conf: this host only (or the nodes), its own ports, no cgroups, no accounting database.
  local host ctld_port slurmd_port ctld_addr=127.0.0.1 node_lines part_nodes i
  host=$(hostname -s)
  ctld_port=$(_slurm_free_port) && slurmd_port=$(_slurm_free_port) || return 1
  [ "$ctld_port" != "$slurmd_port" ] || slurmd_port=$(( ctld_port + 1 ))
  node_lines="NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN"
  part_nodes=$host
  local per_node=""  # several slurmds on one machine: their spool, pid and log files by node name (%n)
  if (( nodes > 1 )); then
    declare -F node_run >/dev/null || { echo "slurm_cluster: $nodes nodes need tests/common/nodes.sh's nodes_start first" >&2; return 1; }
    host=node0
    per_node=-%n
    ctld_addr=$(node_addr 0)
    node_lines=""
    part_nodes=""
    for ((i = 0; i < nodes; i++)); do
      node_lines+="NodeName=node$i NodeAddr=$(node_addr "$i") CPUs=$cpus State=UNKNOWN"$'\n'
      part_nodes+="${part_nodes:+,}node$i"
    done
    # The clients reach slurmctld from node0 only (the nodes' network is theirs).
    local c
    for c in sinfo sbatch squeue scontrol scancel; do
      eval "$c() { nsenter --net=/run/netns/$(node_ns 0) $c \"\$@\"; }"
    done
  fi
  local first_job_id=$(( 1000 + (RANDOM * 32768 + RANDOM) % 50000000 ))
  cat > "$d/slurm.conf" <<EOF
# Generated by tests/slurm/slurm_cluster.sh for one test run; deleted afterwards.
ClusterName=dlotest
SlurmctldHost=$host($ctld_addr)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire also delays a requeued job's restart (default 120 s).
AuthInfo=socket=$d/munge/munge.socket,cred_expire=5
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool$per_node
SlurmctldPidFile=$d/slurmctld.pidfile
SlurmdPidFile=$d/slurmd$per_node.pidfile
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd$per_node.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$d/log/jobcomp.txt
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
# Start jobs (a requeued one after its BeginTime) within a second, not the default 60 s.
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=3
MinJobAge=600
# Job ids differ between clusters started at the same time (Open MPI and PMIx key files on them).
FirstJobId=$first_job_id
MessageTimeout=10
SlurmdTimeout=60
InactiveLimit=0
$node_lines
PartitionName=test Nodes=$part_nodes Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  # PMIx's per-step folders (default /tmp/spmix_appdir_<uid>_<job>.<step>) in ours: two clusters
  # on one machine (parallel test runs) would otherwise collide on the same job ids.
  mkdir -p "$d/pmix"
  printf 'PMIxCliTmpDirBase=%s\n' "$d/pmix" > "$d/mpi.conf"
  export SLURM_CONF=$d/slurm.conf

  # 3. The daemons, in the foreground of background jobs so their PIDs are ours.
  if (( nodes > 1 )); then
    # On the nodes (each slurmd under its node's name, in its namespaces; exec all the way, so
    # the PIDs are the daemons').
    node_run 0 slurmctld -D -i -f "$SLURM_CONF" >"$d/log/slurmctld.out" 2>&1 &
    echo $! > "$d/slurmctld.pid"
    for ((i = 0; i < nodes; i++)); do
      # Node-local folders, as on a real cluster: its spool, and its own view of the PMIx folder
      # (a bind mount in a mount namespace of its own: the steps of one job on two nodes create
      # the same names there).
      mkdir -p "$d/spool-node$i" "$d/pmix-node$i"
      node_run "$i" unshare --mount sh -c 'mount --bind "$0" "$1" && shift && exec "$@"' "$d/pmix-node$i" "$d/pmix" \
        slurmd -D -N "node$i" -f "$SLURM_CONF" >"$d/log/slurmd$i.out" 2>&1 &
      echo $! > "$d/slurmd$i.pid"
    done
  else
    slurmctld -D -i -f "$SLURM_CONF" >"$d/log/slurmctld.out" 2>&1 &
    echo $! > "$d/slurmctld.pid"
    slurmd -D -f "$SLURM_CONF" >"$d/log/slurmd.out" 2>&1 &
    echo $! > "$d/slurmd.pid"
  fi

  # 4. Ready when every node is idle.
  _slurm_node_idle() { [ "$(sinfo -h -N -o %t 2>/dev/null | grep -cx idle)" = "$nodes" ]; }
  if ! _slurm_wait_for 30 _slurm_node_idle; then
    echo "slurm_cluster: $nodes node(s) not idle within 30 s (sinfo: $(sinfo -h -N -o '%N %t %E' 2>&1))" >&2
    _slurm_tail "$d/log/slurmctld.log"; _slurm_tail "$d/log/slurmd.log"
    _slurm_tail "$d/log/slurmctld.out" 5; _slurm_tail "$d/log/slurmd.out" 5
    return 1
  fi
  SLURM_CLUSTER_START_S=$(_slurm_elapsed)
  _slurm_say "cluster up in $SLURM_CLUSTER_START_S s: $part_nodes, $cpus CPUs each, ports $ctld_port/$slurmd_port, $d"
}

# A field of `scontrol show job` (JobState, ExitCode, Reason, ...), empty when unknown.
# slurm_tasks_ended LOG OUTCOME: "TASK@NODE" for each task srun's LOG reports ending with OUTCOME
# (a regex, e.g. "Exited with exit code 143"), sorted. srun reports tasks that end together in one
# line ("node1: tasks 2-3: ...") and others one by one ("node0: task 0: ...").
slurm_tasks_ended() {
  "${PYTHON3:-python3}" - "$1" "$2" <<'PY'
import re, sys
log, outcome = open(sys.argv[1]).read(), sys.argv[2]
seen = set()
for m in re.finditer(r"srun: error: (\S+): tasks? ([0-9,\-]+): (.*)", log):
    if not re.fullmatch(outcome, m.group(3).strip()):
        continue
    for part in m.group(2).split(","):
        a, _, b = part.partition("-")
        seen.update((t, m.group(1)) for t in range(int(a), int(b or a) + 1))
for t, node in sorted(seen):
    print(f"{t}@{node}")
PY
}

slurm_job_field() {
  scontrol -o show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1
}

# Waits up to $2 seconds for job $1 to leave PENDING/RUNNING/COMPLETING etc.; prints its final
# state. Returns 1 (with the state so far) on timeout.
slurm_job_wait() {
  local id=$1 limit=$2 state end=$(( $(date +%s) + $2 ))
  while :; do
    state=$(slurm_job_field "$id" JobState)
    case "$state" in
      COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|PREEMPTED|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE)
        echo "$state"; return 0 ;;
    esac
    if [ "$(date +%s)" -ge "$end" ]; then
      echo "slurm_cluster: job $id still '${state:-unknown}' after $limit s" >&2
      echo "${state:-unknown}"; return 1
    fi
    sleep 0.25
  done
}

slurm_cluster_stop() {
  local d=${SLURM_CLUSTER_DIR:-}
  [ -n "$d" ] && [ -d "$d" ] || return 0
  trap - EXIT INT TERM HUP
  # Jobs first (their tasks die with SIGTERM, then SIGKILL after KillWait), while the daemons
  # still run; bounded, the tagged-process sweep below catches whatever is left.
  if [ -n "${SLURM_CONF:-}" ] && [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
    # shellcheck disable=SC2046  # job ids
    scancel --full --quiet $(squeue -h -o %i 2>/dev/null) 2>/dev/null || true
    _slurm_wait_for 15 eval 'test -z "$(squeue -h -o %i 2>/dev/null)"' || echo "slurm_cluster: jobs still listed after 15 s; killing" >&2
  fi
  local f pid
  local daemons=(slurmd slurmctld munged)
  for f in "$d"/slurmd[0-9]*.pid; do [ -e "$f" ] && daemons=("$(basename "$f" .pid)" "${daemons[@]}"); done
  for f in "${daemons[@]}"; do
    pid=$(cat "$d/$f.pid" 2>/dev/null) || continue
    kill -TERM "$pid" 2>/dev/null || true
  done
  for f in "${daemons[@]}"; do
    pid=$(cat "$d/$f.pid" 2>/dev/null) || continue
    _slurm_wait_for 10 eval "! _slurm_alive $pid" || { echo "slurm_cluster: $f ($pid) ignored SIGTERM for 10 s; SIGKILL" >&2; kill -KILL "$pid" 2>/dev/null; }
    wait "$pid" 2>/dev/null || true
  done
  # Anything still carrying the tag (slurmstepd, tasks) gets SIGKILL.
  local left
  left=$(_slurm_tagged_pids)
  if [ -n "$left" ]; then
    echo "slurm_cluster: killing leftover processes: ${left//$'\n'/ }" >&2
    # shellcheck disable=SC2086  # a list of PIDs
    kill -KILL $left 2>/dev/null || true
    _slurm_wait_for 10 eval 'test -z "$(_slurm_tagged_pids)"' || echo "slurm_cluster: processes survive SIGKILL: $(_slurm_tagged_pids)" >&2
  fi
  if [ -n "${SLURM_CLUSTER_KEEP:-}" ]; then
    echo "slurm_cluster: kept $d (SLURM_CLUSTER_KEEP)" >&2
  else
    rm -rf "$d"
  fi
  SLURM_CLUSTER_DIR=
  unset SLURM_CONF
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -uo pipefail
  case "${1:-}" in
    start)
      slurm_cluster_start "${2:-4}" || { slurm_cluster_stop; exit 1; }
      trap - EXIT INT TERM HUP
      # The daemons must outlive this shell: detach them from its job control.
      disown -a
      echo "export SLURM_CONF=$SLURM_CONF  # stop: $0 stop $SLURM_CLUSTER_DIR" ;;
    stop)
      SLURM_CLUSTER_DIR=${2:?usage: $0 stop DIR}
      export SLURM_CONF=$SLURM_CLUSTER_DIR/slurm.conf DLO_SLURM_CLUSTER_TAG=${SLURM_CLUSTER_DIR##*/}
      slurm_cluster_stop ;;
    *) echo "usage: $0 start [CPUS] | stop DIR" >&2; exit 2 ;;
  esac
fi
