#!/usr/bin/env bash
# The server's instructions per produced event with and without --auth,
# counted by callgrind (repeatable where wall-clock time is not): a
# `strom server` under valgrind, `strom bench produce` of EVENTS 1 KiB
# events from outside it (with a super user's token for --auth), then the
# server's total instruction count divided by the events.
# Usage: bench/auth-callgrind.sh [STROM_BINARY] [EVENTS]
set -euo pipefail
STROM=$(realpath "${1:-target/release/strom}")
EVENTS=${2:-200000}
dir=$(mktemp -d)
trap 'pkill -TERM -f "data-dir $dir/" 2>/dev/null; rm -rf "$dir"' EXIT
cd "$dir"
for mode in plain auth; do
  extra=()
  [ "$mode" = auth ] && extra=(--auth --super-user User:bench)
  valgrind --tool=callgrind --callgrind-out-file="$dir/$mode.out" \
    "$STROM" server --data-dir "$dir/d-$mode" --group-file "$dir/g-$mode.json" "${extra[@]}" \
    2>"$dir/log-$mode" &
  for _ in $(seq 300); do [ -s "$dir/g-$mode.json" ] && break; sleep 0.1; done
  tok=()
  if [ "$mode" = auth ]; then
    "$STROM" token create --subject bench --ttl 1h --data-dir "$dir/d-$mode" > "$dir/tok"
    tok=(--token-file "$dir/tok")
  fi
  "$STROM" --group-file "$dir/g-$mode.json" "${tok[@]}" bench produce --events "$EVENTS" \
    --data-size 1024 --metadata-size 100 --json > /dev/null
  pkill -TERM -f "data-dir $dir/d-$mode"
  wait
  ir=$(grep -h '^summary' "$dir/$mode.out"* | head -1 | awk '{print $2}')
  echo "$mode: server $ir instructions, $(python3 -c "print(round($ir/$EVENTS, 1))") per event"
done
