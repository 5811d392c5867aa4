# Strom: two commands do everything.
#   make run   - set up, build (release) and run the demo on an embedded server
#   make test  - set up, build and run every test (plus fmt and clippy checks)
# Everything is cached inside the repository (target/); nothing outside it.
#   make fresh-check - rehearse both on a new machine (a Debian 12 chroot under
#                      target/fresh/); run it before resolving an issue that adds
#                      a dependency (README.md, "Developing Strom")

SHELL := /bin/bash
CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

# `make run` builds the strom binary with its default features only. The
# tests also build the client's Kafka backend (`kafka://`, librdkafka from
# source) and HDF5 in and out (libhdf5-dev, docs/hdf5.md); every cargo
# command of make test passes the same features, so lint, build and test
# share one set of artifacts.
TEST_FEATURES := --features strom-cli/kafka,strom-cli/hdf5

.PHONY: all setup setup-test build build-release run test test-rust test-smoke lint fmt clean fresh-check

# Each mk/*.mk adds its own setup/build/test steps by appending to these.
EXTRA_BUILD :=
EXTRA_TEST :=
-include mk/*.mk

all: build

# What `make run` needs (a C toolchain, libfabric and clang for the ofi
# transports). Idempotent, no prompts, works as root.
setup:
	@./scripts/setup.sh

# Plus what the tests need (librdkafka's build, kcat, PostgreSQL, MPI,
# Chromium, promtool, Kafka's Java clients).
setup-test:
	@./scripts/setup.sh --test

build: setup-test
	$(CARGO) build --workspace --all-targets $(TEST_FEATURES)
	@for t in $(EXTRA_BUILD); do $(MAKE) --no-print-directory $$t || exit 1; done

build-release: setup
	$(CARGO) build --release -p strom-cli

run: build-release
	./target/release/strom demo

lint: setup-test
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets $(TEST_FEATURES) -- -D warnings

# Every test binary runs under scripts/test-runner: one still running after
# STROM_TEST_LIMIT seconds (900) is hung, and is killed after its stacks are
# printed, so a hang costs minutes of CI, not all of it.
HOST_TRIPLE := $(shell rustc -vV 2>/dev/null | sed -n 's/^host: //p' | tr 'a-z-' 'A-Z_')
TEST_RUNNER := CARGO_TARGET_$(HOST_TRIPLE)_RUNNER=$(CURDIR)/scripts/test-runner

test-rust: setup-test
	$(TEST_RUNNER) $(CARGO) test --workspace --no-fail-fast $(TEST_FEATURES)

# Rust tests first, then every extra suite; all must pass.
test: setup-test lint test-rust
	@for t in $(EXTRA_TEST); do $(MAKE) --no-print-directory $$t || exit 1; done

# A short subset of make test that still needs every system package: the
# whole workspace built with the test features, libstrom's C, C++ and MPI
# tests, the Python venv, and one test per external tool (kcat, PostgreSQL,
# promtool and Chromium, Kafka's Java clients). scripts/fresh-check.sh runs it.
SMOKE_TESTS := --test kafka --test sink_postgres --test observability --test kafka_java
test-smoke: setup-test python-setup
	$(CARGO) build --workspace --all-targets $(TEST_FEATURES)
	$(CARGO) test -p strom-cli $(TEST_FEATURES) $(SMOKE_TESTS)
	$(MAKE) --no-print-directory test-ffi

fresh-check:
	./scripts/fresh-check.sh $(if $(FULL),--full) $(if $(REF),--ref $(REF))

fmt:
	$(CARGO) fmt --all

clean:
	$(CARGO) clean
