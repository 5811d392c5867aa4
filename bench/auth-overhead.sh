#!/usr/bin/env bash
# What authentication costs (docs/security.md): `strom bench produce` and
# `consume` against two `strom server`s on this machine, one plain and one
# with --auth (a super user's token presented once per connection, every
# request decided by the ACLs), interleaved, medians of ROUNDS runs.
# Usage: bench/auth-overhead.sh [STROM_BINARY] [ROUNDS] [EVENTS] [DATA_SIZE]
set -euo pipefail
STROM=${1:-target/release/strom}
ROUNDS=${2:-3}
EVENTS=${3:-200000}
SIZE=${4:-1024}
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT

start() { # name, extra args...
  local name=$1; shift
  "$STROM" server --data-dir "$dir/$name" --group-file "$dir/$name.json" "$@" 2>"$dir/$name.log" &
  for _ in $(seq 200); do [ -s "$dir/$name.json" ] && return; sleep 0.05; done
  echo "server $name did not start" >&2; cat "$dir/$name.log" >&2; exit 1
}
start plain
start auth --auth --super-user User:bench
"$STROM" token create --subject bench --ttl 1h --data-dir "$dir/auth" > "$dir/token"

run() { # name, mode -> MB/s
  local tok=()
  [ "$1" = auth ] && tok=(--token-file "$dir/token")
  "$STROM" --group-file "$dir/$1.json" "${tok[@]}" bench "$2" --events "$EVENTS" \
    --data-size "$SIZE" --metadata-size 100 --json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["mb_per_s"])'
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

for mode in produce consume; do
  : > "$dir/plain.$mode"; : > "$dir/auth.$mode"
  for _ in $(seq "$ROUNDS"); do
    run plain "$mode" >> "$dir/plain.$mode"
    run auth "$mode" >> "$dir/auth.$mode"
  done
  p=$(median < "$dir/plain.$mode"); a=$(median < "$dir/auth.$mode")
  echo "$mode ${SIZE} B: plain $p MB/s, auth $a MB/s, ratio $(python3 -c "print(round($a/$p, 3))") (runs: plain $(tr '\n' ' ' < "$dir/plain.$mode")| auth $(tr '\n' ' ' < "$dir/auth.$mode"))"
done
