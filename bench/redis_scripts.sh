#!/bin/bash
# The Redis server's own time per call of each decision script, beside a trivial script's.
#
#   bench/redis_scripts.sh [rounds] [calls]        (from the repository's root; 5, 20000)
#
# Starts a redis-server on a free loopback port, loads the scripts of src/redis, and runs
# `redis-benchmark -c 4 -r 64` on `EVALSHA` of each, one quota kind at a time (64 keys, quotas
# that never reject, the server's TIME), in interleaved rounds; after each, `INFO
# commandstats` gives the server's usec_per_call. Prints every round, then the median of the
# rounds per row: `floor` is `return 1`; `general` is gcra.lua, `plain` plain.lua, `gcra_only`
# gcra_only.lua (each with prelude.lua), on the same arguments.
set -eu
ROUNDS=${1:-5}
CALLS=${2:-20000}
SRC=src/redis
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 &
SERVER=$!
trap 'kill $SERVER' EXIT
for _ in $(seq 50); do redis-cli -p "$PORT" PING >/dev/null 2>&1 && break; sleep 0.1; done
cli() { redis-cli -p "$PORT" "$@"; }
load() { cli SCRIPT LOAD "$(cat "$@")"; }
declare -A SHA ARGS
SHA[floor]=$(cli SCRIPT LOAD "return 1")
ARGS[floor]="0"
GENERAL=$(load $SRC/prelude.lua $SRC/gcra.lua)
PLAIN=$(load $SRC/prelude.lua $SRC/plain.lua)
SHA[gcra_only]=$(load $SRC/prelude.lua $SRC/gcra_only.lua)
# n, then kind and two numbers per quota (see gcra.lua); then the reservation (0) and two
# zeros per quota.
declare -A QUOTAS=(
  [gcra]="1 0 1 1000000"
  [fixed]="1 1 1000000 1000000"
  [counter]="1 3 1000000 1000000"
  [log]="1 2 10000 1000000"
  [all4]="4 0 1 1000000 1 1000000 1000000 2 10000 1000000 3 1000000 1000000"
)
zeros() { local s=0; for _ in $(seq $((2 * $1))); do s="$s 0"; done; echo "$s"; }
args() { local q=${QUOTAS[$1]}; echo "1 $2:__rand_int__ 1 '' $q $(zeros "${q%% *}")"; }
ARGS[gcra_only]=$(args gcra g)
ROWS="floor gcra_only"
for k in fixed counter log all4; do
  SHA[${k}_general]=$GENERAL; ARGS[${k}_general]=$(args $k "${k}g")
  SHA[${k}_plain]=$PLAIN; ARGS[${k}_plain]=$(args $k "${k}p")
  ROWS="$ROWS ${k}_general ${k}_plain"
done
OUT=$(mktemp)
for r in $(seq "$ROUNDS"); do
  for k in $ROWS; do
    cli CONFIG RESETSTAT >/dev/null
    eval redis-benchmark -h 127.0.0.1 -p "$PORT" -c 4 -n "$CALLS" -r 64 -q EVALSHA "${SHA[$k]}" "${ARGS[$k]}" >/dev/null
    us=$(cli INFO commandstats | grep cmdstat_evalsha | sed 's/.*usec_per_call=\([0-9.]*\).*/\1/')
    errors=$(cli INFO errorstats | grep -c errorstat || true)
    echo "round $r  $k  $us µs  errors $errors" | tee -a "$OUT"
  done
done
echo
echo "median of $ROUNDS rounds, server µs per call:"
for k in $ROWS; do
  printf '%-16s %s\n' "$k" "$(grep "  $k  " "$OUT" | awk '{print $4}' | sort -n | awk '{v[NR]=$1} END{print v[int((NR+1)/2)]}')"
done
rm -f "$OUT"
