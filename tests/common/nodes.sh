# Several "nodes" on this machine for the tests that cross a network (issue 21), sourced after
# tests/common/cli.sh (it uses T, fail and the trap's cleanup):
#
#   source "$(dirname "$0")/../common/nodes.sh"
#   nodes_start 2                  # node0, node1: each a network namespace (and, for what runs in
#                                  # it, a UTS namespace whose hostname is the node's name)
#   nodes_mpirun 2 CMD...          # mpirun on node0 (the head) with 2 ranks per node, over TCP
#   node_run 1 CMD...              # CMD on node1 (its network, its hostname)
#   node_link 1 down|up            # cut or restore node1's link
#   node_slow 1 8mbit|off          # shape node1's link, both ways (tbf)
#   node_delay 1 200|off           # hold node1's outgoing packets 200 ms (delay_line.py)
#   node_kill 1 [PATTERN]          # SIGKILL node1's processes (matching PATTERN; all without one)
#
# The network: a switch namespace holding a bridge, and one veth from each node to it; node i
# has 198.51.100.(10 + i)/24 (TEST-NET-2) and its loopback; nothing else is connected. Open MPI
# starts the other nodes' daemons through an rsh agent that enters the node's namespaces (no
# sshd) and talks over those addresses only (oob and btl tcp restricted to 198.51.100.0/24).
# Names are unique to the test (its pid), so tests running at once do not meet. nodes_stop (also
# on EXIT, after cli.sh's cleanup) kills every process left in the namespaces and deletes them.
# Processes enter a node's network with nsenter (not `ip netns exec`, which remounts /sys without
# the cgroup file system slurmd needs). Needs root, iproute2 (ip netns, veth, bridge) and
# util-linux (nsenter, unshare); nodes_available says whether this machine can (a test exits 77,
# skipped, when it cannot).

NODES_PREFIX="dlo$$"
NODES_COUNT=0
NODES_AGENT="$T/node-agent.sh"
NODES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
declare -a NODES_DELAY_PID=()

nodes_available() {
  [ "$(id -u)" = 0 ] && command -v ip >/dev/null && command -v tc >/dev/null && command -v unshare >/dev/null &&
    command -v nsenter >/dev/null || return 1
  ip netns add "${NODES_PREFIX}probe" 2>/dev/null || return 1
  ip netns del "${NODES_PREFIX}probe"
}

node_ns() { echo "${NODES_PREFIX}n$1"; }
node_addr() { echo "198.51.100.$((10 + $1))"; }

nodes_stop() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${NODES_PREFIX}"); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
}

nodes_start() {  # nodes_start N
  local n=$1 i sw="${NODES_PREFIX}sw"
  NODES_COUNT=$n
  trap 'cleanup; nodes_stop' EXIT
  ip netns add "$sw" || fail "cannot create the switch namespace"
  ip -n "$sw" link add br0 type bridge && ip -n "$sw" link set br0 up || fail "cannot create the bridge"
  for ((i = 0; i < n; i++)); do
    local ns
    ns=$(node_ns "$i")
    ip netns add "$ns" || fail "cannot create node $i's namespace"
    ip link add "${NODES_PREFIX}v$i" type veth peer name "${NODES_PREFIX}s$i" || fail "cannot create node $i's link"
    ip link set "${NODES_PREFIX}v$i" netns "$ns" name eth0
    ip link set "${NODES_PREFIX}s$i" netns "$sw"
    ip -n "$sw" link set "${NODES_PREFIX}s$i" master br0
    ip -n "$sw" link set "${NODES_PREFIX}s$i" up
    ip -n "$ns" addr add "$(node_addr "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
  done
  # Open MPI's rsh agent: `agent [options] HOST CMD...` runs CMD on HOST (node0 ... nodeN-1).
  cat >"$NODES_AGENT" <<EOF
#!/bin/sh
while [ \$# -gt 0 ]; do case "\$1" in -*) shift ;; *) break ;; esac; done
host=\$1; shift
exec nsenter --net=/run/netns/${NODES_PREFIX}n\${host#node} unshare --uts sh -c 'hostname "\$0"; exec sh -c "\$*"' "\$host" "\$@"
EOF
  chmod +x "$NODES_AGENT"
}

node_run() {  # node_run I CMD...: CMD in node I's network and with its hostname
  local i=$1
  shift
  nsenter --net="/run/netns/$(node_ns "$i")" unshare --uts sh -c 'hostname "$0"; exec "$@"' "node$i" "$@"
}

# nodes_mpirun K [--head I] CMD...: CMD as one MPI job of K ranks on each node (ranks node by
# node), mpirun itself on node I (default 0). OMPI_* and DLO_* settings travel with -x.
nodes_mpirun() {
  local k=$1 head=0 hosts="" i
  shift
  if [ "${1:-}" = --head ]; then head=$2; shift 2; fi
  for ((i = 0; i < NODES_COUNT; i++)); do hosts+="${hosts:+,}node$i:$k"; done
  local xs=() v
  for v in $(env | grep -oE '^(OMPI_ALLOW[A-Z_]*|DLO_[A-Z_]*|OMP_NUM_THREADS)=' | tr -d '='); do xs+=(-x "$v"); done
  node_run "$head" mpirun --mca plm_rsh_agent "$NODES_AGENT" --mca oob_tcp_if_include 198.51.100.0/24 \
    --mca btl_tcp_if_include 198.51.100.0/24 --mca btl self,vader,tcp --mca pml ob1 \
    --mca btl_vader_single_copy_mechanism none --host "$hosts" -np $((k * NODES_COUNT)) "${xs[@]}" "$@"
}

node_link() {  # node_link I down|up
  ip -n "${NODES_PREFIX}sw" link set "${NODES_PREFIX}s$1" "$2"
}

# node_slow I RATE: node I's link shaped to RATE each way (NNkbit, NNmbit or NNgbit; tbf on both ends,
# a burst of 2 ms at that rate, up to 400 ms queued); `node_slow I off` restores it. (A fixed
# delay: node_delay.)
node_slow() {
  local end ns dev bits burst
  case "$2" in
    off) bits=0 ;;
    *gbit) bits=$((${2%gbit} * 1000000000)) ;;
    *mbit) bits=$((${2%mbit} * 1000000)) ;;
    *kbit) bits=$((${2%kbit} * 1000)) ;;
    *) fail "node_slow: rate '$2' is not NNkbit, NNmbit or NNgbit" ;;
  esac
  burst=$((bits / 8 / 500 > 4096 ? bits / 8 / 500 : 4096))  # bytes: 2 ms at the rate, at least 4 KB
  for end in "$(node_ns "$1"):eth0" "${NODES_PREFIX}sw:${NODES_PREFIX}s$1"; do
    ns=${end%%:*} dev=${end#*:}
    if [ "$2" = off ]; then
      tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null || true
    else
      tc -n "$ns" qdisc add dev "$dev" root tbf rate "$2" burst "$burst" latency 400ms
    fi
  done
}

# node_delay I MS: node I's outgoing IPv4 packets to the other nodes held MS milliseconds, in order
# (a one-way delay, as netem's on eth0 would be; this kernel has no netem): a tun device, through
# which node I routes the other nodes' addresses, and delay_line.py, which writes each packet out of
# eth0 MS later. `node_delay I off` ends it (its device and routes go with it).
node_delay() {
  local i=$1 ns j peers=()
  ns=$(node_ns "$i")
  if [ -n "${NODES_DELAY_PID[$i]:-}" ]; then  # off, or a new delay in place of the old
    kill "${NODES_DELAY_PID[$i]}" 2>/dev/null || true
    wait "${NODES_DELAY_PID[$i]}" 2>/dev/null || true
    NODES_DELAY_PID[$i]=""
  fi
  [ "$2" = off ] && return 0
  for ((j = 0; j < NODES_COUNT; j++)); do
    [ "$j" = "$i" ] && continue
    peers+=("$(node_addr "$j")=$(ip -n "$(node_ns "$j")" -br link show eth0 | awk '{print $3}')")
  done
  nsenter --net="/run/netns/$ns" python3 "$NODES_DIR/delay_line.py" eth0 dly0 "$2" "${peers[@]}" >"$T/delay$i.log" 2>&1 &
  NODES_DELAY_PID[$i]=$!
  for _ in $(seq 400); do ip -n "$ns" link show dly0 >/dev/null 2>&1 && break; sleep 0.05; done
  ip -n "$ns" link set dly0 up || fail "node $i's delay line did not start: $(cat "$T/delay$i.log")"
  # Replies from the others arrive on eth0 while the way back to them is dly0: no reverse-path filter.
  nsenter --net="/run/netns/$ns" sh -c 'for f in /proc/sys/net/ipv4/conf/*/rp_filter; do echo 0 >"$f"; done'
  for ((j = 0; j < NODES_COUNT; j++)); do
    [ "$j" = "$i" ] || ip -n "$ns" route add "$(node_addr "$j")/32" dev dly0 src "$(node_addr "$i")"
  done
}

node_kill() {  # node_kill I [PATTERN]: SIGKILL node I's processes (those whose command line matches PATTERN)
  local p
  for p in $(ip netns pids "$(node_ns "$1")"); do
    if [ -z "${2:-}" ] || tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q -- "$2"; then kill -KILL "$p" 2>/dev/null || true; fi
  done
}

# The bytes node I sent and received over its link so far.
node_bytes() {
  ip -n "$(node_ns "$1")" -s -j link show eth0 | python3 -c \
    "import json,sys; s=json.load(sys.stdin)[0]['stats64']; print(s['tx']['bytes'], s['rx']['bytes'])"
}
