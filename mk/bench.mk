# strom bench against Kafka and Redis (crates/strom-cli feature `peers`) and
# the comparison suite (bench/run-suite).
#   make bench-peers-check  - type-check and lint the `peers` feature (builds
#                             librdkafka from source with cmake); part of make test
#   make bench              - run the whole comparison suite (not part of make test);
#                             BENCH_FULL=1 for the issue's full event counts,
#                             BENCH_REPS, BENCH_ONLY=s1,s3, BENCH_TAG=before,
#                             STROM_BIN (see docs/benchmarks.md)
#   make bench PROFILE=1    - the same, plus a flame graph per Strom figure
#                             (perf + inferno) in bench/results/<date>[-tag]-flame/

.PHONY: bench-peers-deps bench-peers-check bench

bench-peers-deps:
	@bash -c 'source bench/peers/common.sh && apt_install cmake libcurl4-openssl-dev'

bench-peers-check: bench-peers-deps
	$(CARGO) clippy -p strom-cli --all-targets --features peers -- -D warnings

PROFILE ?=

bench: bench-peers-deps
	PROFILE=$(PROFILE) ./bench/run-suite

EXTRA_TEST += bench-peers-check
