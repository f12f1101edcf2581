#!/bin/bash
# The live testbed without Mininet or Python, for a machine that has only the daemons (a GPU box, say):
#   testbed/live/bare-up.sh TOPOLOGY BIN_DIR [COMMAND ARGS...]
# makes every node of TOPOLOGY a network namespace (ifec-NODE), every link a veth pair (f<port> at both ends, MTU
# 9216; the daemons pace themselves), a management bridge (ifecbare0, 172.31.0.1/16: node i at 172.31.0.(i+2)),
# starts ifec-switchd / ifec-hostd from BIN_DIR (ifec-cli netns-plan gives the wiring), waits until every hostd's
# descriptor ring is ready (bootstrapped), runs COMMAND with BIN_DIR first on PATH, and takes everything down again,
# by PID and by name, whatever happens. Its exit status is COMMAND's (0 without one). Needs root and iproute2
# (BIN_DIR/ip is used where the machine has none); libraries in BIN_DIR/../lib are found. Daemon logs:
# ${IFEC_BARE_LOGS:-/tmp/ifec-bare}/NODE.log.
set -u
if [ $# -lt 2 ]; then
  echo "usage: $0 TOPOLOGY BIN_DIR [COMMAND ARGS...]" >&2
  exit 2
fi
TOPO=$(realpath "$1"); BIN=$(realpath "$2"); shift 2
[ -d "$BIN/../lib" ] && export LD_LIBRARY_PATH="$(realpath "$BIN/../lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
IP=$(command -v ip || echo "$BIN/ip")
LOGS=${IFEC_BARE_LOGS:-/tmp/ifec-bare}
BRIDGE=ifecbare0
for p in ifec-cli ifec-switchd ifec-hostd ifec-ring; do
  [ -x "$BIN/$p" ] || { echo "bare-up: $BIN/$p: missing (build it: ./ifec build)" >&2; exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "bare-up: needs root (namespaces, veths)" >&2; exit 2; }
PLAN=$("$BIN/ifec-cli" netns-plan "$TOPO") || exit 2
if "$IP" link show $BRIDGE >/dev/null 2>&1 || "$IP" link show ifecmgmt0 >/dev/null 2>&1; then
  echo "bare-up: a live testbed is up here (bridge $BRIDGE or ifecmgmt0 exists)" >&2
  exit 2
fi
mkdir -p "$LOGS"
PIDS=(); NSES=()
down() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    alive=0; for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break; sleep 0.5
  done
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for n in "${NSES[@]}"; do "$IP" netns del "$n" 2>/dev/null; done
  "$IP" link del $BRIDGE 2>/dev/null
  command -v iptables >/dev/null && iptables -D FORWARD -i $BRIDGE -o $BRIDGE -j ACCEPT 2>/dev/null
  return 0
}
trap down EXIT
trap 'exit 130' INT TERM
fail() { echo "bare-up: $*" >&2; exit 1; }
# A firewall's FORWARD policy (dockerd sets DROP) would drop the bridge's packets under br_netfilter.
command -v iptables >/dev/null && iptables -I FORWARD -i $BRIDGE -o $BRIDGE -j ACCEPT 2>/dev/null
"$IP" link add $BRIDGE type bridge && "$IP" addr add 172.31.0.1/16 dev $BRIDGE && "$IP" link set $BRIDGE up ||
  fail "cannot make the management bridge $BRIDGE"
while read -r kind a b c d e; do
  if [ "$kind" = node ]; then
    NSES+=("ifec-$a")
    "$IP" netns add "ifec-$a" && "$IP" link add "ifbare$b" type veth peer name m0 netns "ifec-$a" &&
      "$IP" link set "ifbare$b" master $BRIDGE up && "$IP" -n "ifec-$a" addr add "$c/16" dev m0 &&
      "$IP" -n "ifec-$a" link set m0 up && "$IP" -n "ifec-$a" link set lo up || fail "cannot make node $a"
  else
    "$IP" link add "$b" netns "ifec-$a" type veth peer name "$d" netns "ifec-$c" &&
      "$IP" -n "ifec-$a" link set "$b" mtu 9216 up && "$IP" -n "ifec-$c" link set "$d" mtu 9216 up ||
      fail "cannot make link $a:$b - $c:$d"
  fi
done <<< "$PLAN"
GPUS=()
while read -r kind a b c d e; do
  [ "$kind" = node ] || continue
  prog=ifec-switchd; [ "$d" = gpu ] && { prog=ifec-hostd; GPUS+=("$a"); }
  "$IP" netns exec "ifec-$a" "$BIN/$prog" --topo "$TOPO" --node "$a" > "$LOGS/$a.log" 2>&1 &
  PIDS+=($!)
done <<< "$PLAN"
echo "bare-up: ${#NSES[@]} namespaces, $(grep -c '^link' <<< "$PLAN") links, ${#PIDS[@]} daemons (logs in $LOGS)"
t0=$SECONDS
while :; do
  ready=0
  for g in "${GPUS[@]}"; do "$BIN/ifec-ring" "$g" info 2>/dev/null | grep -q '"ready":true' && ready=$((ready + 1)); done
  [ $ready = ${#GPUS[@]} ] && break
  for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null || fail "a daemon (pid $p) exited during bring-up: see $LOGS"; done
  [ $((SECONDS - t0)) -lt 60 ] || fail "$ready of ${#GPUS[@]} hostds ready after 60 s: see $LOGS"
  sleep 0.5
done
sleep 2  # FARE's advertisements every 100 ms: every plane weighted
echo "bare-up: every hostd ready ($((SECONDS - t0)) s)"
status=0
if [ $# -gt 0 ]; then
  PATH="$BIN:$PATH" "$@"
  status=$?
fi
exit $status
