# make demo   - set up everything (venv, pinned packages, Debian packages) and run the demo
# make test   - set up everything and run every test: C (plain, ASan+UBSan, TSan), the fuzzer and Python
#
# Other targets: setup, install, ctest, ctest-asan, ctest-tsan, fuzz, pytest, bench, bench-smoke, format, format-check, clean

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
XLA_INC = $(shell $(PY) -c "import jax.ffi; print(jax.ffi.include_dir())")
CMAKE_C = cmake -S . -G Ninja -DHCB_BUILD_TESTS=ON -DHCB_WERROR=ON -DPython_EXECUTABLE=$(abspath $(PY))
C_SOURCES = include/hcb/*.h src/*.[ch] python/_hcb/*.[ch] tests/c/*.[ch] tests/c/*.cpp examples/*/*.c fuzz/*.c
DEBIAN_PACKAGES := libcmocka-dev cmake ninja-build gcc clang valgrind pkg-config

.PHONY: demo test setup install ctest ctest-asan ctest-tsan fuzz pytest bench bench-smoke format format-check clean

demo: install
	$(PY) examples/demo.py

test: install format-check ctest ctest-asan ctest-tsan fuzz pytest

# ---- setup ------------------------------------------------------------------
$(VENV)/.deps: requirements.txt
	@missing=""; for p in $(DEBIAN_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq $$missing; fi
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $@

setup: $(VENV)/.deps

install: setup
	HCB_WERROR=ON $(PY) -m pip install -q --no-build-isolation --no-deps .

# ---- C tests ----------------------------------------------------------------
ctest: setup
	$(CMAKE_C) -B build/c -DCMAKE_BUILD_TYPE=Debug >/dev/null
	cmake --build build/c
	ctest --test-dir build/c --output-on-failure

ctest-asan: setup
	$(CMAKE_C) -B build/asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang -DHCB_SANITIZE=address >/dev/null
	cmake --build build/asan
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir build/asan --output-on-failure

ctest-tsan: setup
	$(CMAKE_C) -B build/tsan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang -DHCB_SANITIZE=thread >/dev/null
	cmake --build build/tsan
	TSAN_OPTIONS=halt_on_error=1 ctest --test-dir build/tsan --output-on-failure

# ---- fuzzing (clang's libFuzzer) --------------------------------------------
# A short run from the committed seeds in fuzz/corpus/print; what it learns
# goes to build/fuzz/corpus, a crashing input to build/fuzz/ (and fails).
fuzz: setup
	cmake -S . -G Ninja -B build/fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
	  -DHCB_BUILD_FUZZERS=ON -DHCB_WERROR=ON -DPython_EXECUTABLE=$(abspath $(PY)) >/dev/null
	cmake --build build/fuzz --target fuzz_print
	mkdir -p build/fuzz/corpus/print
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 build/fuzz/fuzz_print \
	  -max_total_time=20 -rss_limit_mb=2048 -artifact_prefix=build/fuzz/ \
	  build/fuzz/corpus/print fuzz/corpus/print

# ---- Python tests -----------------------------------------------------------
pytest: install
	$(PY) -m pytest -q tests/python

# ---- benchmarks (bench/README.md) -------------------------------------------
bench: install
	$(PY) bench/run.py

bench-smoke: install
	$(PY) bench/run.py --smoke --out build/bench-smoke

format:
	clang-format -i $(C_SOURCES)

format-check:
	clang-format --dry-run --Werror $(C_SOURCES)

clean:
	rm -rf build
