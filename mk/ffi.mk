# libstrom (crates/strom-ffi): the C API, the C++ and Fortran layers, and the
# MPI examples.
#   make header                 - regenerate include/strom.h with cbindgen
#   make ffi                    - build libstrom (debug; FFI_PROFILE=release)
#   make install PREFIX=DIR     - install lib/libstrom.{so,a}, include/strom.{h,hpp,f90}
#                                 and lib/pkgconfig/strom.pc (FFI_PROFILE=release)
#   make test-ffi               - the C and C++ tests (plain and under ASan and
#                                 UBSan), C with a token over TLS against a real
#                                 server, a program built with pkg-config against
#                                 an installed copy, and the MPI examples; part
#                                 of make test

FFI_PROFILE ?= debug
FFI_OUT := target/ffi
FFI_LIB_DIR := target/$(FFI_PROFILE)
FFI_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
PREFIX ?= /usr/local
FFI_CFLAGS := -Wall -Wextra -Werror -g -Iinclude
FFI_LIBS := -lpthread -ldl -lm
FFI_SAN := -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
# LeakSanitizer is on: freeing every handle must free everything.
FFI_SAN_ENV := ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

.PHONY: header ffi install test-ffi ffi-c-tests ffi-tls-token ffi-install-test ffi-doc-example ffi-mpi \
	ffi-mpi-lib ffi-mpi-channel ffi-mpich

# libstrom_mpi (include/strom_mpi.h, docs/mpi.md): the MPI channels, C over
# libstrom, built with the MPI compiler wrapper of the MPI it is used with.
MPICC ?= mpicc
MPIRUN ?= mpirun --allow-run-as-root --oversubscribe
FFI_MPI_SRC := $(wildcard crates/strom-ffi/mpi/*.c)
FFI_MPI_LIB := $(FFI_OUT)/libstrom_mpi.a
FFI_MPI_CFLAGS := -std=c11 -Wall -Wextra -Werror -O2 -g -fPIC -Iinclude

EXTRA_TEST += test-ffi

header:
	STROM_BLESS_HEADER=1 $(CARGO) test -q -p strom-ffi --test header

ffi:
	$(CARGO) build -p strom-ffi $(if $(filter release,$(FFI_PROFILE)),--release,)

install: ffi
	install -d $(PREFIX)/lib/pkgconfig $(PREFIX)/include
	install -m 644 $(FFI_LIB_DIR)/libstrom.a $(PREFIX)/lib/libstrom.a
	install -m 755 $(FFI_LIB_DIR)/libstrom.so $(PREFIX)/lib/libstrom.so.$(FFI_VERSION)
	ln -sf libstrom.so.$(FFI_VERSION) $(PREFIX)/lib/libstrom.so.0
	ln -sf libstrom.so.0 $(PREFIX)/lib/libstrom.so
	install -m 644 include/strom.h include/strom.hpp include/strom.f90 $(PREFIX)/include/
	if command -v $(MPICC) >/dev/null; then $(MAKE) --no-print-directory ffi-mpi-lib && \
		install -m 644 $(FFI_MPI_LIB) $(PREFIX)/lib/ && \
		install -m 644 include/strom_mpi.h include/strom_mpi.f90 $(PREFIX)/include/; fi
	sed -e 's|@PREFIX@|$(abspath $(PREFIX))|' -e 's|@VERSION@|$(FFI_VERSION)|' \
		crates/strom-ffi/strom.pc.in > $(PREFIX)/lib/pkgconfig/strom.pc

test-ffi: ffi ffi-c-tests ffi-tls-token ffi-install-test ffi-doc-example ffi-mpi-channel ffi-mpi \
	ffi-mpich

ffi-mpi-lib: $(FFI_MPI_LIB)

$(FFI_MPI_LIB): $(FFI_MPI_SRC) crates/strom-ffi/mpi/channel_internal.h include/strom_mpi.h include/strom.h
	@mkdir -p $(FFI_OUT)/mpi-lib
	for f in $(FFI_MPI_SRC); do \
		$(MPICC) $(FFI_MPI_CFLAGS) -c $$f -o $(FFI_OUT)/mpi-lib/$$(basename $$f .c).o || exit 1; done
	rm -f $@ && ar rcs $@ $(patsubst crates/strom-ffi/mpi/%.c,$(FFI_OUT)/mpi-lib/%.o,$(FFI_MPI_SRC))

# The channel tests again under MPICH (scripts/setup.sh installs it beside
# Open MPI): libstrom_mpi is compiled with MPICH's mpicc, as an MPICH user
# would.
FFI_MPICH := $(FFI_OUT)/mpich
ffi-mpich: ffi
	@mkdir -p $(FFI_MPICH)
	for f in $(FFI_MPI_SRC); do \
		mpicc.mpich $(FFI_MPI_CFLAGS) -c $$f -o $(FFI_MPICH)/$$(basename $$f .c).o || exit 1; done
	rm -f $(FFI_MPICH)/libstrom_mpi.a && ar rcs $(FFI_MPICH)/libstrom_mpi.a $(FFI_MPICH)/*.o
	for t in test_channel test_kill; do \
		mpicc.mpich -std=c11 -D_GNU_SOURCE $(FFI_CFLAGS) tests/mpi/$$t.c $(FFI_MPICH)/libstrom_mpi.a \
			$(FFI_LIB_DIR)/libstrom.a $(FFI_LIBS) -o $(FFI_MPICH)/$$t || exit 1; done
	timeout -k 10 180 mpirun.mpich -n 4 $(FFI_MPICH)/test_channel
	$(CARGO) build -p strom-cli $(TEST_FEATURES) --bin strom
	tests/mpi/kill.sh target/debug/strom $(FFI_MPICH)/test_kill mpirun.mpich

# The channel API's own tests under mpirun (tests/mpi/), and what happens
# when a consumer rank dies (tests/mpi/kill.sh, against a real server).
ffi-mpi-channel: ffi $(FFI_MPI_LIB)
	$(MPICC) -std=c11 -D_GNU_SOURCE $(FFI_CFLAGS) tests/mpi/test_channel.c $(FFI_MPI_LIB) \
		$(FFI_LIB_DIR)/libstrom.a $(FFI_LIBS) -o $(FFI_OUT)/test_mpi_channel
	timeout -k 10 180 $(MPIRUN) -n 4 $(FFI_OUT)/test_mpi_channel
	$(CARGO) build -p strom-cli $(TEST_FEATURES) --bin strom
	$(MPICC) -std=c11 -D_GNU_SOURCE $(FFI_CFLAGS) tests/mpi/test_kill.c $(FFI_MPI_LIB) \
		$(FFI_LIB_DIR)/libstrom.a $(FFI_LIBS) -o $(FFI_OUT)/test_mpi_kill
	tests/mpi/kill.sh target/debug/strom $(FFI_OUT)/test_mpi_kill $(MPIRUN)

# libstrom with a token over TLS against a real `strom server --auth` on
# tls:// (tests/c/tls_token.sh makes the certificates and tokens).
ffi-tls-token: ffi
	@mkdir -p $(FFI_OUT)
	$(CARGO) build -p strom-cli $(TEST_FEATURES) --bin strom
	$(CC) -std=c11 $(FFI_CFLAGS) tests/c/test_tls_token.c $(FFI_LIB_DIR)/libstrom.a $(FFI_LIBS) -o $(FFI_OUT)/test_tls_token
	tests/c/tls_token.sh target/debug/strom $(FFI_OUT)/test_tls_token

# The C and C++ tests against the static library, plain and sanitized; the
# C suite also over ofi+tcp and ofi+shm (libstrom is built with libfabric).
ffi-c-tests: ffi
	@mkdir -p $(FFI_OUT)
	$(CC) -std=c11 $(FFI_CFLAGS) tests/c/test_strom.c $(FFI_LIB_DIR)/libstrom.a $(FFI_LIBS) -o $(FFI_OUT)/test_c
	$(CC) -std=c11 $(FFI_CFLAGS) $(FFI_SAN) tests/c/test_strom.c $(FFI_LIB_DIR)/libstrom.a $(FFI_LIBS) -o $(FFI_OUT)/test_c_san
	$(CXX) -std=c++17 $(FFI_CFLAGS) tests/cpp/test_strom.cpp $(FFI_LIB_DIR)/libstrom.a $(FFI_LIBS) -o $(FFI_OUT)/test_cpp
	$(CXX) -std=c++17 $(FFI_CFLAGS) $(FFI_SAN) tests/cpp/test_strom.cpp $(FFI_LIB_DIR)/libstrom.a $(FFI_LIBS) -o $(FFI_OUT)/test_cpp_san
	timeout 300 $(FFI_OUT)/test_c
	STROM_TEST_LISTEN=ofi+tcp://auto timeout 300 $(FFI_OUT)/test_c
	STROM_TEST_LISTEN=ofi+shm://auto timeout 300 $(FFI_OUT)/test_c
	$(FFI_SAN_ENV) timeout 300 $(FFI_OUT)/test_c_san
	timeout 300 $(FFI_OUT)/test_cpp
	$(FFI_SAN_ENV) timeout 300 $(FFI_OUT)/test_cpp_san

# What a user does: install, then build with pkg-config against the shared
# library, in a directory of its own.
ffi-install-test: ffi
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	$(MAKE) --no-print-directory install PREFIX=$$tmp/prefix >/dev/null; \
	export PKG_CONFIG_PATH=$$tmp/prefix/lib/pkgconfig; \
	echo "pkg-config strom: $$(pkg-config --modversion strom) $$(pkg-config --cflags --libs strom)"; \
	$(CC) -std=c11 tests/c/test_strom.c $$(pkg-config --cflags --libs strom) -o $$tmp/test_c_shared; \
	$(CXX) -std=c++17 tests/cpp/test_strom.cpp $$(pkg-config --cflags --libs strom) -o $$tmp/test_cpp_shared; \
	ldd $$tmp/test_c_shared | grep -q "libstrom.so.0 => $$tmp/prefix/lib/" || \
		{ echo "test_c_shared does not load the installed libstrom.so.0"; ldd $$tmp/test_c_shared; exit 1; }; \
	timeout 300 $$tmp/test_c_shared; timeout 300 $$tmp/test_cpp_shared

# The complete example of docs/c-api.md (its first C block), as printed there.
ffi-doc-example: ffi
	@mkdir -p $(FFI_OUT)
	awk '/^```c$$/{on=1; next} /^```$$/{if (on) exit} on' docs/c-api.md > $(FFI_OUT)/doc_example.c
	$(CC) -std=c11 $(FFI_CFLAGS) $(FFI_OUT)/doc_example.c $(FFI_LIB_DIR)/libstrom.a $(FFI_LIBS) -o $(FFI_OUT)/doc_example
	timeout 120 $(FFI_OUT)/doc_example

# The MPI examples (examples/mpi/README.md) at small size under mpirun.
ffi-mpi: ffi $(FFI_MPI_LIB)
	$(MAKE) --no-print-directory -C examples/mpi check STROM_LIB=$(CURDIR)/$(FFI_LIB_DIR)/libstrom.a \
		STROM_MPI_LIB=$(CURDIR)/$(FFI_MPI_LIB) OUT=$(CURDIR)/$(FFI_OUT)/mpi
