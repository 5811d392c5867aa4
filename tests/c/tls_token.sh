#!/usr/bin/env bash
# Runs tests/c/test_tls_token against a real server with --auth on tls://:
# a CA and a server certificate for 127.0.0.1 (openssl, made here and
# deleted after), a super user's token and a user's (strom token create).
# Usage: tests/c/tls_token.sh STROM_BINARY TEST_BINARY
set -euo pipefail
STROM=$1
TEST=$2
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
  -subj /CN=c-test-ca -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=localhost \
  -keyout "$dir/key.pem" -out "$dir/cert.csr" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' > "$dir/ext"
openssl x509 -req -in "$dir/cert.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
  -CAcreateserial -days 1 -extfile "$dir/ext" -out "$dir/cert.pem" 2>/dev/null

"$STROM" server --data-dir "$dir/data" --group-file "$dir/group.json" \
  --listen tls://127.0.0.1:0 --auth --super-user User:admin \
  --tls-cert "$dir/cert.pem" --tls-key "$dir/key.pem" 2> "$dir/server.log" &
for _ in $(seq 1 200); do
  [ -s "$dir/group.json" ] && break
  sleep 0.05
done
[ -s "$dir/group.json" ] || { echo "the server did not start:"; cat "$dir/server.log"; exit 1; }
admin=$("$STROM" token create --subject admin --ttl 1h --data-dir "$dir/data")
user=$("$STROM" token create --subject alice --ttl 1h --data-dir "$dir/data")
env -u STROM_TOKEN -u STROM_TOKEN_FILE -u STROM_TLS_CA \
  timeout 120 "$TEST" "$dir/group.json" "$dir/ca.pem" "$admin" "$user" || {
  echo "--- server log ---"; tail -20 "$dir/server.log"; exit 1; }
