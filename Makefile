# Strom: two commands do everything.
#   make run   - set up, build (release) and run the demo on an embedded server
#   make test  - set up, build and run every test (plus fmt and clippy checks)
# Everything is cached inside the repository (target/); nothing outside it.

SHELL := /bin/bash
CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

.PHONY: all setup build build-release run test test-rust lint fmt clean

# Each mk/*.mk adds its own setup/build/test steps by appending to these.
EXTRA_BUILD :=
EXTRA_TEST :=
-include mk/*.mk

all: build

# Tools the build and tests need. Idempotent, no prompts, works as root.
setup:
	@./scripts/setup.sh

build: setup
	$(CARGO) build --workspace --all-targets
	@for t in $(EXTRA_BUILD); do $(MAKE) --no-print-directory $$t || exit 1; done

build-release: setup
	$(CARGO) build --release -p strom-cli

run: build-release
	./target/release/strom demo

lint: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test-rust: setup
	$(CARGO) test --workspace --no-fail-fast

# Rust tests first, then every extra suite; all must pass.
test: setup lint test-rust
	@for t in $(EXTRA_TEST); do $(MAKE) --no-print-directory $$t || exit 1; done

fmt:
	$(CARGO) fmt --all

clean:
	$(CARGO) clean
