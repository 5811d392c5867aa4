#!/usr/bin/env bash
# Installs what building and testing Strom needs, when it is missing.
# Safe to run repeatedly; never prompts; runs as root or via sudo.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif have sudo; then sudo -n "$@"; else
    echo "setup: need root to run: $*" >&2; return 1; fi
}

apt_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "setup: installing ${missing[*]}" >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

if ! have cargo; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    echo "setup: cargo is in ~/.cargo/bin; add it to PATH" >&2
  else
    echo "setup: Rust is required (https://rustup.rs); install rustup and re-run" >&2
  fi
  exit 1
fi
rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt clippy >/dev/null 2>&1 || true

if have apt-get && have dpkg; then
  # openmpi-bin: the mpirun launcher test; libopenmpi-dev and gfortran:
  # the MPI examples of libstrom (mpicc, mpicxx, mpifort).
  # postgresql: the `strom sink postgres` tests start a throw-away cluster
  # with its initdb/postgres (as the `postgres` user the package creates).
  # prometheus: `promtool check metrics` on the /metrics endpoint.
  # chromium: the dashboard test loads the page headless.
  # libfabric-dev libclang-dev clang: strom-ofi's build script runs bindgen
  # over <rdma/fabric.h> (the ofi+* transports, on by default in strom-net).
  # kcat: the Kafka front end's tests produce and consume with it (librdkafka).
  # cmake: strom-client's `kafka` feature (on in strom-cli and the client's
  # tests) compiles librdkafka from source.
  apt_install build-essential pkg-config openmpi-bin libopenmpi-dev gfortran postgresql prometheus chromium libfabric-dev libclang-dev clang kcat cmake
fi

# Kafka's Java clients (kafka-clients) for crates/strom-cli/tests/kafka_java.rs.
"$(dirname "$0")/java-kafka.sh"
