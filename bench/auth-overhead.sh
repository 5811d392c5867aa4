#!/usr/bin/env bash
# What security costs (docs/security.md): `strom bench produce` and
# `consume` against three `strom server`s on this machine, interleaved,
# medians of ROUNDS runs each:
#   plain  TCP, no auth;
#   auth   TCP, --auth (a super user's token presented once per
#          connection, every request decided by the ACLs);
#   tls    tls:// with a self-signed certificate (openssl), --auth and a token.
# Memory partitions (nothing written to disk; each run its own topic).
# Usage: bench/auth-overhead.sh [STROM_BINARY] [ROUNDS] [EVENTS] [DATA_SIZE]
set -euo pipefail
STROM=${1:-target/release/strom}
ROUNDS=${2:-3}
EVENTS=${3:-200000}
SIZE=${4:-1024}
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT

# A CA, and a certificate for 127.0.0.1 it signs (the clients trust the CA).
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=bench-ca \
  -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=localhost \
  -keyout "$dir/key.pem" -out "$dir/cert.csr" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' > "$dir/ext"
openssl x509 -req -in "$dir/cert.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
  -CAcreateserial -days 1 -extfile "$dir/ext" -out "$dir/cert.pem" 2>/dev/null

start() { # name, listen, extra args...
  local name=$1 listen=$2; shift 2
  "$STROM" server --data-dir "$dir/$name" --group-file "$dir/$name.json" --listen "$listen" "$@" \
    2>"$dir/$name.log" &
  for _ in $(seq 200); do [ -s "$dir/$name.json" ] && return; sleep 0.05; done
  echo "server $name did not start" >&2; cat "$dir/$name.log" >&2; exit 1
}
start plain 127.0.0.1:0
start auth 127.0.0.1:0 --auth --super-user User:bench
start tls tls://127.0.0.1:0 --auth --super-user User:bench \
  --tls-cert "$dir/cert.pem" --tls-key "$dir/key.pem"
"$STROM" token create --subject bench --ttl 1h --data-dir "$dir/auth" > "$dir/auth.token"
"$STROM" token create --subject bench --ttl 1h --data-dir "$dir/tls" > "$dir/tls.token"

run() { # name, mode -> MB/s
  local extra=()
  [ "$1" != plain ] && extra=(--token-file "$dir/$1.token")
  [ "$1" = tls ] && extra+=(--tls-ca "$dir/ca.pem")
  "$STROM" --group-file "$dir/$1.json" "${extra[@]}" bench "$2" --events "$EVENTS" \
    --data-size "$SIZE" --metadata-size 100 --partition-type memory --json 2>/dev/null |
    python3 -c 'import json,sys; print(round(json.load(sys.stdin)["mb_per_s"], 1))'
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

for mode in produce consume; do
  for s in plain auth tls; do : > "$dir/$s.$mode"; done
  for _ in $(seq "$ROUNDS"); do
    for s in plain auth tls; do run "$s" "$mode" >> "$dir/$s.$mode"; done
  done
  p=$(median < "$dir/plain.$mode")
  line="$mode ${SIZE} B x $EVENTS, MB/s (median of $ROUNDS):"
  for s in plain auth tls; do
    m=$(median < "$dir/$s.$mode")
    line+=" $s $m ($(python3 -c "print(round($m/$p, 3))")x; runs $(tr '\n' ' ' < "$dir/$s.$mode" | sed 's/ $//'))"
  done
  echo "$line"
done
