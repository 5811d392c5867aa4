# The randomized fault loop (crates/strom-cli/tests/fault_loop.rs) runs 50
# cycles inside make test; this runs it longer. Not part of make test.
#   make fault-loop [CYCLES=500] [SEED=n]   (SEED replays one run)
.PHONY: fault-loop
CYCLES ?= 500
fault-loop: setup-test
	STROM_FAULT_CYCLES=$(CYCLES) $(if $(SEED),STROM_FAULT_SEED=$(SEED)) \
		$(CARGO) test -p strom-cli $(TEST_FEATURES) --test fault_loop -- --nocapture

# The same loop on a 3-voter metadata quorum (fault_loop_quorum.rs):
# SIGKILL and SIGSTOP of the registry's leader among the faults, topic
# administration while it is down, every created topic checked at the end.
#   make fault-loop-quorum [CYCLES=500] [SEED=n]
.PHONY: fault-loop-quorum
fault-loop-quorum: setup-test
	STROM_FAULT_CYCLES=$(CYCLES) $(if $(SEED),STROM_FAULT_SEED=$(SEED)) \
		$(CARGO) test -p strom-cli $(TEST_FEATURES) --test fault_loop_quorum -- --nocapture
