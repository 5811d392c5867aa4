# Python package `strom` (python/): a PyO3 + maturin extension plus pure-Python
# helpers, installed into a repository-local venv (python/.venv).
#   make python-setup  - create the venv and install maturin, numpy, pytest (once)
#   make python-build  - build the extension (release) into the venv
#   make wheel         - build the installable wheel into target/wheels
#   make python-test   - run the Python suite (with the wheel's install test)
#                        and the tomography example test

PY_DIR := python
PY_VENV := $(PY_DIR)/.venv
PY := $(PY_VENV)/bin/python
# pyzmq: the comparison system of bench/python/pipeline.py (suite scenario 7).
# confluent-kafka, kafka-python: python/tests/test_kafka.py, against the
# Kafka front end (docs/kafka.md).
# moto[server]: the S3-compatible server the object-store tier tests run
# against (crates/*/tests/tiering.rs find python/.venv/bin/moto_server).
# dask, distributed: strom.dask (workflow provenance) and its example,
# examples/provenance (docs/provenance.md).
# h5py: crates/strom-cli/tests/hdf5.rs writes the files `strom topic load`
# reads and reads what `stage-out --format hdf5` writes (docs/hdf5.md).
# mpi4py: strom.mpi, MPI channels for Python (docs/mpi.md; its wheel loads
# the Open MPI that scripts/setup.sh installs).
PY_PKGS := maturin numpy pytest pytest-timeout pyzmq confluent-kafka kafka-python 'moto[server]' dask distributed h5py mpi4py
# One shared target directory, so the Strom crates are not compiled twice.
PY_TARGET := $(CURDIR)/target
# Where `make wheel` puts strom-<version>-cp311-abi3-<platform>.whl.
PY_WHEELS := $(PY_TARGET)/wheels

.PHONY: python-setup python-build python-test python-bench wheel

python-setup: $(PY_VENV)/.strom-setup

$(PY_VENV)/.strom-setup: mk/python.mk
	@test -x $(PY) || python3 -m venv $(PY_VENV) || { \
		apt-get install -y -qq python3-venv >/dev/null && python3 -m venv $(PY_VENV); }
	@$(PY) -c 'import maturin, numpy, pytest, pytest_timeout, zmq, confluent_kafka, kafka, moto.server, dask, distributed, h5py, mpi4py' 2>/dev/null || \
		$(PY) -m pip install --quiet --no-cache-dir --disable-pip-version-check $(PY_PKGS)
	@touch $@

python-build: python-setup
	cd $(PY_DIR) && CARGO_TARGET_DIR=$(PY_TARGET) VIRTUAL_ENV=$(CURDIR)/$(PY_VENV) \
		PATH=$(CURDIR)/$(PY_VENV)/bin:$$PATH maturin develop --release --quiet

# The wheel a user outside the repository installs with pip (python/README.md).
# Same release profile and target directory as python-build, so after it
# only the wheel is packed.
wheel: python-setup
	cd $(PY_DIR) && CARGO_TARGET_DIR=$(PY_TARGET) PATH=$(CURDIR)/$(PY_VENV)/bin:$$PATH \
		maturin build --release --quiet --interpreter $(CURDIR)/$(PY) --out $(PY_WHEELS)

# The binding's own Rust unit tests, then the Python suite and the
# tomography example, which start `target/debug/strom` for the
# multi-process cases (rebuilt first, as a stale binary speaking an older
# protocol than the extension fails with "protocol error"). test_wheel.py
# pip-installs the wheel built here into a fresh venv. pytest exits non-zero
# on failures and when it collects no test.
python-test: python-build wheel
	$(CARGO) build --quiet -p strom-cli
	cd $(PY_DIR) && CARGO_TARGET_DIR=$(PY_TARGET) $(CARGO) test --release --lib --quiet
	STROM_BIN=$(CURDIR)/target/debug/strom STROM_WHEEL_DIR=$(PY_WHEELS) \
		$(PY) -m pytest -q -p no:cacheprovider --timeout=300 $(PY_DIR)/tests examples/tomography examples/task-queue examples/provenance

python-bench: python-build
	$(PY) -m strom.bench

EXTRA_BUILD += python-build
EXTRA_TEST += python-test

# The Rust suite's stage-out test reads the files it wrote back with numpy
# from this venv (crates/strom-cli/tests/stage_out.rs), and its HDF5 test
# uses h5py from it (crates/strom-cli/tests/hdf5.rs): set it up first.
test-rust: python-setup
