# Fuzzing the protocol and policy decoders with cargo-fuzz (fuzz/README.md).
#   make fuzz        - run every target for FUZZ_SECONDS seconds each (default 60);
#                      needs a nightly toolchain and installs cargo-fuzz if missing.
#                      FUZZ_TARGETS="frame batch" picks targets. Not part of make test.
#   make fuzz-check  - type-check, lint and format-check the fuzz crate on stable,
#                      so the targets cannot rot; part of make test.
# The stable replay tests (crates/*/tests/hostile_input.rs) run the committed
# corpus and 100,000 mutants per crate in make test either way.

FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= frame request response push batch policy_binary policy_validate kafka_request
# Everything a fuzzing run writes (build, grown corpus, crashes) stays in target/.
FUZZ_OUT := $(CURDIR)/target/fuzz

.PHONY: fuzz fuzz-setup fuzz-check

fuzz-setup:
	@$(CARGO) +nightly --version >/dev/null 2>&1 || \
		rustup toolchain install nightly --profile minimal >/dev/null 2>&1 || { \
		echo "make fuzz: cargo-fuzz needs a nightly Rust toolchain, and" >&2; \
		echo "  'rustup toolchain install nightly --profile minimal' failed here." >&2; \
		echo "  Install nightly and re-run; make test still replays the corpus on stable." >&2; \
		exit 2; }
	@$(CARGO) fuzz --version >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked

# libFuzzer writes new inputs to the first corpus directory only, so the
# committed seeds (second directory) stay untouched; crashes land in
# target/fuzz/artifacts/<target>/. Each run stops at the first failure.
fuzz: fuzz-setup
	@for t in $(FUZZ_TARGETS); do \
		mkdir -p $(FUZZ_OUT)/corpus/$$t $(FUZZ_OUT)/artifacts/$$t || exit 1; \
		echo "fuzz: $$t for $(FUZZ_SECONDS)s"; \
		( cd fuzz && $(CARGO) +nightly fuzz run --target-dir $(FUZZ_OUT)/build $$t \
			$(FUZZ_OUT)/corpus/$$t corpus/$$t -- \
			-max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -malloc_limit_mb=256 \
			-artifact_prefix=$(FUZZ_OUT)/artifacts/$$t/ -print_final_stats=1 ) || { \
			echo "fuzz: $$t failed; the input is in $(FUZZ_OUT)/artifacts/$$t/" >&2; exit 1; }; \
	done
	@echo "fuzz: $(words $(FUZZ_TARGETS)) targets ran $(FUZZ_SECONDS)s each without a failure"

fuzz-check:
	cd fuzz && $(CARGO) fmt --check
	cd fuzz && $(CARGO) clippy --target-dir $(FUZZ_OUT)/check --bins -- -D warnings

EXTRA_TEST += fuzz-check
