# strom bench against Kafka and Redis (crates/strom-cli feature `peers`) and
# the comparison suite (bench/run-suite).
#   make bench-peers-check  - type-check and lint the `peers` feature (builds
#                             librdkafka from source with cmake); part of make test
#   make bench              - run the whole comparison suite (not part of make test);
#                             BENCH_FULL=1 for the issue's full event counts

.PHONY: bench-peers-deps bench-peers-check bench

bench-peers-deps:
	@bash -c 'source bench/peers/common.sh && apt_install cmake libcurl4-openssl-dev'

bench-peers-check: bench-peers-deps
	$(CARGO) clippy -p strom-cli --all-targets --features peers -- -D warnings

bench: bench-peers-deps
	./bench/run-suite

EXTRA_TEST += bench-peers-check
