#!/bin/bash
# The Redis server's own time per call of each decision script, beside a trivial script's.
#
#   bench/redis_scripts.sh [rounds] [calls]        (from the repository's root; 5, 20000)
#   BEFORE=<other tree>/src/redis bench/redis_scripts.sh ...
#   CALLGRIND=1 bench/redis_scripts.sh [rounds] [calls]                        (3, 1500)
#
# Starts a redis-server on a free loopback port, loads the scripts of src/redis, and runs
# `redis-benchmark -c 4 -r 64` on `EVALSHA` of each, one quota kind at a time (64 keys, quotas
# that never reject, the server's TIME), in interleaved rounds; after each, `INFO
# commandstats` gives the server's usec_per_call. Prints every round, then the median of the
# rounds per row: `floor` is `return 1`; `general` is gcra.lua, `plain` plain.lua, `gcra_only`
# gcra_only.lua (each with prelude.lua), on the same arguments, as the store sends a request
# (the zeros that end the arguments left out).
#
# BEFORE: the scripts of another tree are loaded beside these, and each row of theirs, marked
# `<`, runs right before the same row of these, with the arguments that store sent: by default
# a commit before the store left out the ending zeros (every row sends them); with
# BEFORE_SENT=warm, one before a warm-up policy's call left them out (d35e172: only the `warm`
# row sends them).
#
# CALLGRIND: the server runs under valgrind's callgrind, and each row is counted in
# instructions per call (the whole server: reading the command, the script, the reply) with
# `redis-benchmark -c 1`; instructions repeat from run to run where µs move with the load of
# the machine. Needs valgrind.
set -eu
CG=${CALLGRIND:-}
if [ -n "$CG" ]; then ROUNDS=${1:-3}; CALLS=${2:-1500}; else ROUNDS=${1:-5}; CALLS=${2:-20000}; fi
SRC=src/redis
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
OUT=$(mktemp)
CGDIR=$(mktemp -d)
if [ -n "$CG" ]; then
  valgrind --tool=callgrind --callgrind-out-file="$CGDIR/cg.%p" \
    redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 &
else
  redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 &
fi
SERVER=$!
trap 'kill $SERVER; rm -rf "$OUT" "$CGDIR"' EXIT
for _ in $(seq 300); do redis-cli -p "$PORT" PING >/dev/null 2>&1 && break; sleep 0.1; done
cli() { redis-cli -p "$PORT" "$@"; }
load() { cli SCRIPT LOAD "$(cat "$@")"; }
declare -A SHA ARGS
SHA[floor]=$(cli SCRIPT LOAD "return 1")
ARGS[floor]="0"
# n, then kind and two numbers per quota (see gcra.lua).
declare -A QUOTAS=(
  [gcra]="1 0 1 1000000"
  [fixed]="1 1 1000000 1000000"
  [counter]="1 3 1000000 1000000"
  [log]="1 2 10000 1000000"
  [all4]="4 0 1 1000000 1 1000000 1000000 2 10000 1000000 3 1000000 1000000"
  # GCRA with warm-up (kind 4), then the reservation's 0 and its period and cold factor,
  # which are sent by position whatever ends the arguments.
  [warm]="1 4 1 1000000 0 1000000 3"
)
zeros() { local s=0; for _ in $(seq $((2 * $1))); do s="$s 0"; done; echo "$s"; }
# The arguments of a request on quotas $1, keys named $2, with the zeros that end them ($3).
args() {
  local q=${QUOTAS[$1]}
  if [ -n "$3" ]; then
    if [ "$1" = warm ]; then q="$q $(zeros "${q%% *}" | cut -d' ' -f2-)"
    elif [ "${BEFORE_SENT:-all}" = all ]; then q="$q $(zeros "${q%% *}")"; fi
  fi
  echo "1 $2:__rand_int__ 1 '' $q"
}
ROWS=""
# Rows of the scripts in $1, named with the suffix $2 (keys with $3), with the ending zeros
# if $4.
rows() {
  local general plain
  general=$(load "$1/prelude.lua" "$1/gcra.lua")
  plain=$(load "$1/prelude.lua" "$1/plain.lua")
  SHA[gcra_only$2]=$(load "$1/prelude.lua" "$1/gcra_only.lua")
  ARGS[gcra_only$2]=$(args gcra "g$3" "$4")
  for k in fixed counter log all4; do
    SHA[${k}_general$2]=$general; ARGS[${k}_general$2]=$(args $k "${k}g$3" "$4")
    SHA[${k}_plain$2]=$plain; ARGS[${k}_plain$2]=$(args $k "${k}p$3" "$4")
  done
  # A warm-up policy runs the general script only.
  SHA[warm_general$2]=$general; ARGS[warm_general$2]=$(args warm "wg$3" "$4")
}
rows "$SRC" "" "" ""
# The store sent the ending zeros before it left them out: so do the rows of BEFORE.
if [ -n "${BEFORE:-}" ]; then rows "$BEFORE" "<" "b" zeros; fi
ROWS="floor"
for k in gcra_only fixed_general fixed_plain counter_general counter_plain log_general log_plain \
    all4_general all4_plain warm_general; do
  if [ -n "${BEFORE:-}" ]; then ROWS="$ROWS $k<"; fi
  ROWS="$ROWS $k"
done
bench() {
  eval redis-benchmark -h 127.0.0.1 -p "$PORT" -c "$1" -n "$2" -r 64 -q EVALSHA "${SHA[$3]}" \
    "${ARGS[$3]}" >/dev/null
}
for r in $(seq "$ROUNDS"); do
  for k in $ROWS; do
    if [ -n "$CG" ]; then
      # Keys filled first, then the calls counted alone.
      bench 1 500 "$k"
      callgrind_control -z $SERVER >/dev/null 2>&1
      bench 1 "$CALLS" "$k"
      callgrind_control -d $SERVER >/dev/null 2>&1
      dump=$(ls -t "$CGDIR"/cg.$SERVER.* | head -1)
      total=$(grep -m1 '^summary:\|^totals:' "$dump" | awk '{print $2}')
      rm -f "$CGDIR"/cg.$SERVER.*
      value=$((total / CALLS))
      unit="instructions"
    else
      cli CONFIG RESETSTAT >/dev/null
      bench 4 "$CALLS" "$k"
      value=$(cli INFO commandstats | grep cmdstat_evalsha | sed 's/.*usec_per_call=\([0-9.]*\).*/\1/')
      unit="µs"
    fi
    errors=$(cli INFO errorstats | grep -c errorstat || true)
    echo "round $r  $k  $value $unit  errors $errors" | tee -a "$OUT"
  done
done
echo
echo "median of $ROUNDS rounds, server $unit per call:"
for k in $ROWS; do
  printf '%-18s %s\n' "$k" "$(grep -F "  $k  " "$OUT" | awk '{print $4}' | sort -n | awk '{v[NR]=$1} END{print v[int((NR+1)/2)]}')"
done
