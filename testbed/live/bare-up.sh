#!/bin/bash
# The live testbed without Mininet or Python, for a machine that has only the daemons (a GPU box, say):
#   testbed/live/bare-up.sh TOPOLOGY BIN_DIR [COMMAND ARGS...]
#   testbed/live/bare-up.sh --down          (what a killed run left: its namespaces, their daemons, the bridge)
# makes every node of TOPOLOGY a network namespace (ifec-NODE), every link a veth pair (f<port> at both ends, MTU
# 9216; the daemons pace themselves), a management bridge (ifecbare0, 172.31.0.1/16: node i at 172.31.0.(i+2)),
# starts ifec-switchd / ifec-hostd from BIN_DIR (ifec-cli netns-plan gives the wiring), waits until every hostd's
# descriptor ring is ready (bootstrapped), runs COMMAND with BIN_DIR first on PATH, and takes down what it made, by
# PID and by name, whatever happens (SIGINT/SIGTERM go to COMMAND first). Its exit status is COMMAND's (0 without
# one; 128 + the signal's number when one ended it). Needs root and iproute2 (BIN_DIR/ip, with BIN_DIR/../lib, where
# the machine has none); one run at a time (its PID in a lock file). Daemon logs:
# ${IFEC_BARE_LOGS:-/tmp/ifec-bare}/NODE.log. The control plane: mutual TLS with the certificates in
# $IFEC_BARE_TLS (ca.pem, NODE.pem/.key per node, as ifec.pki makes them) where it is set; otherwise plaintext
# (--insecure, said in every daemon's log): the management bridge is this machine's alone, but any process on it
# can then reach every daemon.
set -u
BRIDGE=ifecbare0
LOCK=${IFEC_BARE_LOCK:-/run/ifec-bare.lock}
usage() { echo "usage: $0 TOPOLOGY BIN_DIR [COMMAND ARGS...] | $0 --down" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "bare-up: needs root (namespaces, veths)" >&2; exit 2; }
# One run at a time: its PID in $LOCK, claimed under a short flock (no child inherits the lock: a killed run's
# daemons do not keep the next one out; a PID that is gone, or is no bare-up, is stale).
{
  flock -w 10 9 || { echo "bare-up: cannot lock $LOCK.flock" >&2; exit 2; }
  other=$(cat "$LOCK" 2>/dev/null)
  if [ -n "$other" ] && [ "$other" != $$ ] && grep -qs bare-up "/proc/$other/cmdline"; then
    echo "bare-up: another run (pid $other) is under way" >&2
    exit 2
  fi
  echo $$ > "$LOCK"
} 9>"$LOCK.flock"
release() { [ "$(cat "$LOCK" 2>/dev/null)" = $$ ] && rm -f "$LOCK"; return 0; }
trap release EXIT

# iproute2: the machine's, else the bundle's with its libraries (only for it: other programs keep the system's).
IP=(ip)
bundle_ip() {
  command -v ip >/dev/null || IP=(env "LD_LIBRARY_PATH=$(realpath "$1/../lib" 2>/dev/null)" "$1/ip")
}

if [ "${1:-}" = --down ]; then  # by name: every ifec-* namespace (its processes first) and the bridge
  [ $# -ge 2 ] && bundle_ip "$2"
  for ns in $("${IP[@]}" netns list 2>/dev/null | awk '$1 ~ /^ifec-/ {print $1}'); do
    for p in $("${IP[@]}" netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    "${IP[@]}" netns del "$ns" && echo "bare-up: removed namespace $ns"
  done
  for l in $("${IP[@]}" -o link show 2>/dev/null | awk -F': ' '$2 ~ /^ifbare[0-9]+@/ {sub(/@.*/, "", $2); print $2}'); do
    "${IP[@]}" link del "$l" && echo "bare-up: removed link $l"  # a namespace still held (by a socket, say)
  done
  "${IP[@]}" link del $BRIDGE 2>/dev/null && echo "bare-up: removed bridge $BRIDGE"
  command -v iptables >/dev/null && while iptables -D FORWARD -i $BRIDGE -o $BRIDGE -j ACCEPT 2>/dev/null; do :; done
  exit 0
fi
[ $# -ge 2 ] || usage
TOPO=$(realpath "$1"); BIN=$(realpath "$2"); shift 2
bundle_ip "$BIN"
LOGS=${IFEC_BARE_LOGS:-/tmp/ifec-bare}
for p in ifec-cli ifec-switchd ifec-hostd ifec-ring; do
  [ -x "$BIN/$p" ] || { echo "bare-up: $BIN/$p: missing (build it: ./ifec build)" >&2; exit 2; }
done
"${IP[@]}" -V >/dev/null 2>&1 || { echo "bare-up: no iproute2 (ip) here or in $BIN" >&2; exit 2; }
PLAN=$("$BIN/ifec-cli" netns-plan "$TOPO") || exit 2
if "${IP[@]}" link show $BRIDGE >/dev/null 2>&1 || "${IP[@]}" link show ifecmgmt0 >/dev/null 2>&1 ||
  "${IP[@]}" netns list 2>/dev/null | grep -q '^ifec-' || "${IP[@]}" -o link show | grep -q ': ifbare[0-9]*@'; then
  echo "bare-up: a live testbed is up here (bridge $BRIDGE or ifecmgmt0, ifec-* namespaces or ifbare* links): $0" \
    "--down" >&2
  exit 2
fi
mkdir -p "$LOGS"

PIDS=(); NSES=(); MADE_BRIDGE=0; RULE=0; CMD=0
down() {
  trap '' INT TERM HUP  # the take-down runs to its end
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    alive=0; for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break; sleep 0.5
  done
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for n in "${NSES[@]}"; do "${IP[@]}" netns del "$n" 2>/dev/null; done
  [ $MADE_BRIDGE = 1 ] && "${IP[@]}" link del $BRIDGE 2>/dev/null
  [ $RULE = 1 ] && iptables -D FORWARD -i $BRIDGE -o $BRIDGE -j ACCEPT 2>/dev/null
  release
}
on_signal() {  # to COMMAND first (it ends, then the take-down runs); during the bring-up, straight to the take-down
  SIGNALLED=$2
  [ $CMD != 0 ] && kill -"$1" $CMD 2>/dev/null
  [ $RUNNING = 0 ] && exit $((128 + $2))
  return 0
}
SIGNALLED=0; RUNNING=0
trap down EXIT
trap 'on_signal INT 2' INT
trap 'on_signal TERM 15' TERM
trap 'on_signal HUP 1' HUP
fail() { echo "bare-up: $*" >&2; exit 1; }

# A firewall's FORWARD policy (dockerd sets DROP) would drop the bridge's packets under br_netfilter.
command -v iptables >/dev/null && iptables -I FORWARD -i $BRIDGE -o $BRIDGE -j ACCEPT 2>/dev/null && RULE=1
"${IP[@]}" link add $BRIDGE type bridge || fail "cannot make the management bridge $BRIDGE"
MADE_BRIDGE=1
"${IP[@]}" addr add 172.31.0.1/16 dev $BRIDGE && "${IP[@]}" link set $BRIDGE up || fail "cannot set up $BRIDGE"
while read -r kind a b c d _; do
  if [ "$kind" = node ]; then
    "${IP[@]}" netns add "ifec-$a" || fail "cannot make namespace ifec-$a"
    NSES+=("ifec-$a")
    "${IP[@]}" link add "ifbare$b" type veth peer name m0 netns "ifec-$a" &&
      "${IP[@]}" link set "ifbare$b" master $BRIDGE up && "${IP[@]}" -n "ifec-$a" addr add "$c/16" dev m0 &&
      "${IP[@]}" -n "ifec-$a" link set m0 up && "${IP[@]}" -n "ifec-$a" link set lo up || fail "cannot wire node $a"
  else
    "${IP[@]}" link add "$b" netns "ifec-$a" type veth peer name "$d" netns "ifec-$c" &&
      "${IP[@]}" -n "ifec-$a" link set "$b" mtu 9216 up && "${IP[@]}" -n "ifec-$c" link set "$d" mtu 9216 up ||
      fail "cannot make link $a:$b - $c:$d"
  fi
done <<< "$PLAN"
GPUS=()
while read -r kind a b c d _; do
  [ "$kind" = node ] || continue
  prog=ifec-switchd; [ "$d" = gpu ] && { prog=ifec-hostd; GPUS+=("$a"); }
  "${IP[@]}" netns exec "ifec-$a" "$BIN/$prog" --topo "$TOPO" --node "$a" \
    $([ -n "${IFEC_BARE_TLS:-}" ] && echo "--tls-dir $IFEC_BARE_TLS" || echo --insecure) > "$LOGS/$a.log" 2>&1 &
  PIDS+=($!)
done <<< "$PLAN"
echo "bare-up: ${#NSES[@]} namespaces, $(grep -c '^link' <<< "$PLAN") links, ${#PIDS[@]} daemons (pids" \
  "${PIDS[*]}; logs in $LOGS)"
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
  RUNNING=1  # from here a signal is only noted until COMMAND's PID is known
  PATH="$BIN:$PATH" "$@" &
  CMD=$!
  [ $SIGNALLED != 0 ] && kill -TERM $CMD 2>/dev/null
  wait $CMD; status=$?
  while kill -0 $CMD 2>/dev/null; do wait $CMD; status=$?; done  # a signal interrupts wait, not COMMAND
fi
[ $SIGNALLED != 0 ] && status=$((128 + SIGNALLED))
exit $status
