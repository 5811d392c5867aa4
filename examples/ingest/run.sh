#!/usr/bin/env bash
# The ingest pipeline end to end, on one machine:
#
#   strom gen (x G, each its own devices) -> Strom -> strom sink postgres -> PostgreSQL
#                                                   -> strom verify
#
# It starts a Strom server (with its HTTP endpoint: metrics and dashboard),
# a throw-away PostgreSQL cluster (scripts/pg-cluster.sh), the sink, and G
# generators for DURATION seconds. Once every generator has closed its
# producers the stream ends, the sink commits its last rows and stops, and
# verify reads the topic again. It then checks that the table holds every
# event exactly once and prints what each stage achieved.
#
#   examples/ingest/run.sh [--rate R] [--devices N] [--generators G]
#                          [--duration S] [--partitions P] [--batch K]
#                          [--durability D] [--http HOST:PORT] [--keep]
#
# STROM names the strom binary (default: target/release/strom, built by
# `make build-release`). --http 127.0.0.1:9464 matches prometheus.yml here;
# the default picks a free port. --keep leaves the work directory.
# Exit 0 only when verify passes and rows == distinct event ids == produced.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
strom=${STROM:-$root/target/release/strom}
rate=20000 devices=10000 generators=2 duration=10 partitions=4 batch=5000
durability=always http=127.0.0.1:0 keep=0
while [ $# -gt 0 ]; do
  case $1 in
    --rate) rate=$2; shift 2 ;;
    --devices) devices=$2; shift 2 ;;
    --generators) generators=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --partitions) partitions=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --durability) durability=$2; shift 2 ;;
    --http) http=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "usage: $0 [--rate R] [--devices N] [--generators G] [--duration S] [--partitions P] [--batch K] [--durability D] [--http HOST:PORT] [--keep]" >&2; exit 2 ;;
  esac
done
[ -x "$strom" ] || { echo "$0: no strom binary at $strom (make build-release, or set STROM)" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/strom-ingest.XXXXXX")
chmod 755 "$work"  # the PostgreSQL cluster runs as user postgres under root
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  [ -f "$work/pg/data/PG_VERSION" ] && "$root/scripts/pg-cluster.sh" stop "$work/pg" 2>/dev/null
  if [ "$keep" = 1 ]; then echo "work directory kept: $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

# 1. Strom, with its HTTP endpoint.
"$strom" server --data-dir "$work/data" --group-file "$work/group.json" \
  --http-listen "$http" 2> "$work/server.log" &
server_pid=$!
for _ in $(seq 200); do grep -q "strom http listening" "$work/server.log" 2>/dev/null && break; sleep 0.05; done
http_addr=$(sed -n 's#^strom http listening on http://##p' "$work/server.log")
[ -n "$http_addr" ] || { cat "$work/server.log" >&2; exit 1; }
export STROM_GROUP_FILE=$work/group.json
echo "strom: metrics http://$http_addr/metrics, dashboard http://$http_addr/" >&2
"$strom" topic create telemetry --partitions "$partitions" --durability "$durability" \
  --validator json-schema --schema "@$here/telemetry.schema.json" >&2

# 2. PostgreSQL and the sink, reading until the end of the stream.
dsn=$("$root/scripts/pg-cluster.sh" start "$work/pg")
"$strom" sink postgres --topic telemetry --name pg-sink --dsn "$dsn" --table readings \
  --batch "$batch" \
  --columns 'event_id:uuid,device_id:text,seq:bigint,ts=timestamp:timestamptz,temperature:double,humidity:double,pressure:double,status:text' \
  > "$work/sink.out" 2> "$work/sink.err" &
sink_pid=$!

# 3. The generators, each with its own devices and share of the rate.
gen_pids=()
for g in $(seq "$generators"); do
  "$strom" gen --topic telemetry --devices $((devices / generators)) --device-prefix "g$g-" \
    --rate $((rate / generators)) --duration "$duration" --workers 2 --json \
    > "$work/gen-$g.out" 2> "$work/gen-$g.err" &
  gen_pids+=($!)
done
sleep $((duration / 2))
echo "--- strom top, mid-run ---" >&2
"$strom" top --http "$http_addr" --once >&2 || true
gen_failed=0
for p in "${gen_pids[@]}"; do wait "$p" || gen_failed=1; done
gens_done=$(date +%s.%N)
sink_rc=0
wait "$sink_pid" || sink_rc=$?
# How long the sink needed after the last generator stopped: near 0 when
# it kept up with the generators, growing with the backlog when it did not.
sink_tail=$(awk -v now="$(date +%s.%N)" -v then="$gens_done" 'BEGIN { printf "%.2f", now - then }')

# 4. What landed, checked.
psql_q() { psql "$dsn" -Atc "$1"; }
http_get() {  # GET $1 from the HTTP endpoint, body only (no curl needed)
  exec 3<>"/dev/tcp/${http_addr%:*}/${http_addr##*:}"
  printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$1" "$http_addr" >&3
  sed '1,/^\r$/d' <&3
  exec 3<&-
}
produced=0
for g in $(seq "$generators"); do
  n=$(grep '"type":"summary"' "$work/gen-$g.out" | sed -n 's/.*"acked":\([0-9]*\).*/\1/p')
  produced=$((produced + ${n:-0}))
  grep '"type":"summary"' "$work/gen-$g.out" | sed "s/^/gen $g: /" >&2
done
rows=$(psql_q "SELECT count(*) FROM readings")
distinct=$(psql_q "SELECT count(DISTINCT event_id) FROM readings")
verify_rc=0
"$strom" verify --topic telemetry --name verifier --json > "$work/verify.json" 2> "$work/verify.err" || verify_rc=$?
cat "$work/sink.out" >&2
echo "--- metrics (selected) ---" >&2
http_get "/metrics" \
  | grep -E '^strom_(partition_(in_events_total|fsync_latency_seconds_(sum|count))|consumer_lag_events)' >&2 || true
echo "ingest: produced=$produced rows=$rows distinct=$distinct verify_rc=$verify_rc sink_rc=$sink_rc gen_failed=$gen_failed sink_tail_s=$sink_tail"
if [ "$gen_failed" = 0 ] && [ "$sink_rc" = 0 ] && [ "$verify_rc" = 0 ] \
   && [ "$produced" -gt 0 ] && [ "$rows" = "$produced" ] && [ "$distinct" = "$produced" ]; then
  echo "ingest: OK, every event exactly once in PostgreSQL, and verify passed"
else
  echo "ingest: FAILED (see $work with --keep)" >&2
  cat "$work/sink.err" "$work/verify.json" "$work/verify.err" >&2 || true
  exit 1
fi
