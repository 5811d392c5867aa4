#!/usr/bin/env bash
# Fetches Kafka's Java clients (kafka-clients 4.3.1 and slf4j-simple, from
# Maven Central through tests/java-kafka/pom.xml) into target/java-kafka/lib,
# for tests/java-kafka/Check.java (crates/strom-cli/tests/kafka_java.rs).
# Installs a JDK (single-file source mode compiles in memory: a JRE is not
# enough) and Maven when missing. Idempotent; never prompts; runs as root.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LIB="$ROOT/target/java-kafka/lib"
POM="$ROOT/tests/java-kafka/pom.xml"

have() { command -v "$1" >/dev/null 2>&1; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif have sudo; then sudo -n "$@"; else
    echo "java-kafka: need root to run: $*" >&2; return 1; fi
}

if have apt-get; then
  # A JDK (javac: single-file source mode compiles in memory) and Maven.
  missing=()
  have javac || missing+=(default-jdk-headless)
  have mvn || missing+=(maven)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "java-kafka: installing ${missing[*]}" >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

for t in java javac mvn; do
  have "$t" || { echo "java-kafka: $t is missing: install a JDK (17 or newer) and Maven" >&2; exit 1; }
done

# The stamp records the pom it was fetched for: editing the pom fetches again.
STAMP="$LIB/.complete"
want="$(sha256sum "$POM" | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
  rm -rf "$LIB"
  mkdir -p "$LIB"
  mvn -q -B -Dstyle.color=never -f "$POM" dependency:copy-dependencies \
    -DoutputDirectory="$LIB" -DincludeScope=runtime
  echo "$want" > "$STAMP"
fi
