#!/usr/bin/env bash
# Installs what building and testing Strom needs, when it is missing.
#   scripts/setup.sh          what `make run` needs (the strom binary)
#   scripts/setup.sh --test   plus what `make test` needs (every suite)
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

# Two sets: what `make run` needs (building the strom binary with its
# default features), and what `make test` adds (`--test`). Every package
# either needs is listed here: scripts/fresh-check.sh proves it on a new
# machine of this project's kind.
mode=run
[ "${1:-}" = "--test" ] && mode=test

run_pkgs=(
  # a C toolchain for the crates that compile C (mimalloc, zstd, lz4, ring)
  build-essential pkg-config
  # strom-ofi's build script runs bindgen over <rdma/fabric.h> (the ofi+*
  # transports, a default feature of the strom binary)
  libfabric-dev libclang-dev clang
)
test_pkgs=(
  # strom-client's `kafka` backend and the `peers` bench build librdkafka
  # from source: cmake, and libcurl's headers (rdkafka_conf.c includes
  # <curl/curl.h> even with OIDC off)
  cmake libcurl4-openssl-dev
  # the mpirun launcher test; libstrom's MPI examples (mpicc, mpicxx, mpifort)
  openmpi-bin libopenmpi-dev gfortran
  # the MPI channels' tests once more under MPICH (mpicc.mpich,
  # mpirun.mpich); Open MPI stays the default mpicc and mpirun (its
  # alternatives have the higher priority); mpi.h for MPICH is in
  # libmpich-dev, only a recommendation of mpich
  mpich libmpich-dev
  # `strom sink postgres` tests start a throw-away cluster with initdb/postgres
  postgresql
  # `promtool check metrics` on the /metrics endpoint
  prometheus
  # the dashboard test loads the page headless
  chromium
  # the Kafka front end's tests produce and consume with kcat (librdkafka)
  kcat
  # HDF5 in and out (strom-cli's `hdf5` feature, which make test turns on;
  # docs/hdf5.md). Not a run package: the default strom binary does not
  # link libhdf5, so `make run` builds and runs without it.
  libhdf5-dev
)

if have apt-get && have dpkg; then
  if [ "$mode" = test ]; then
    # python/.venv (mk/python.mk) needs the venv module.
    python3 -m venv --help >/dev/null 2>&1 || test_pkgs+=(python3-venv)
    apt_install "${run_pkgs[@]}" "${test_pkgs[@]}"
  else
    apt_install "${run_pkgs[@]}"
  fi
else
  echo "setup: no apt-get here; install the equivalents of: ${run_pkgs[*]}" >&2
  [ "$mode" = test ] && echo "setup: and for the tests: ${test_pkgs[*]}" >&2
fi

if [ "$mode" = test ]; then
  # Kafka's Java clients (kafka-clients) for crates/strom-cli/tests/kafka_java.rs.
  "$(dirname "$0")/java-kafka.sh"
fi
