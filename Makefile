# make demo   - set up what the demo needs (a venv with jax and the build tools; a C compiler and
#               Python 3.11 from Debian only where missing) and run the demo
# make test   - set up everything and run every test: C (plain, ASan+UBSan, TSan, valgrind), the
#               fuzzer, Python on every supported JAX, type checks and a pip install into a fresh venv
# make check  - the fast loop (about a minute on 2 idle cores): the C tests and the Python tests
#               of the API most changes touch, on the development venv (docs/contributing.md)
#
# make help   - every target, with what it does (the "## " after each target below)

SHELL := /bin/bash
# The supported combinations, one pin file each in requirements/: the first
# is the development environment (.venv), where everything runs; the others
# run the Python test suite, each in .venv-<name>.
MAIN := py3.11-jax0.10.2
MATRIX := py3.11-jax0.6.2 py3.11-jax0.7.2 py3.11-jax0.8.3 py3.11-jax0.9.2 py3.12-jax0.11.2 py3.13-jax0.12.0.1
VENV := .venv
PY := $(VENV)/bin/python
CMAKE_C = cmake -S . -G Ninja -DHCB_BUILD_TESTS=ON -DHCB_WERROR=ON -DPython_EXECUTABLE=$(abspath $(PY))
C_SOURCES = include/hcb/*.h src/*/*.[ch] python/_hcb/*.[ch] tests/c/*.[ch] tests/c/*.cpp examples/*/*.c fuzz/*.c
# Every command a recipe or a test runs comes from one of these, from Debian's
# essential packages, from the virtualenvs or from this checkout
# (tests/python/test_makefile.py checks it): clang for ctest-asan/-tsan and
# fuzz, with its sanitizer and libFuzzer runtimes (libclang-rt-dev, which
# clang only recommends), clang-format for format-check, git for the pip
# install tests, python3-venv and python3-dev for Debian's own Python 3.11.
DEBIAN_PACKAGES := libcmocka-dev cmake ninja-build gcc g++ clang libclang-rt-dev clang-format \
  valgrind pkg-config git python3-venv python3-dev
# The Python suites run on both cores (pytest-xdist; each file in one worker,
# in its order); PYTEST_JOBS=0 runs them in one process.
PYTEST_JOBS ?= 2
PYTEST = -m pytest -q -p no:cacheprovider -n $(PYTEST_JOBS) --dist loadfile
# pip builds in build/py-<venv> (kept between runs); a plain `pip install .`
# builds in a temporary directory instead.
PIP_INSTALL = HCB_WERROR=ON $(1)/bin/python -m pip install -q --no-build-isolation --no-deps \
  --config-settings=build-dir=build/py-$(1) .
# The Python version of a combination: py3.12-jax0.11.2 -> 3.12
PYVER = $(patsubst py%,%,$(firstword $(subst -, ,$(1))))

help: ## this list
	@echo "make TARGET, where TARGET is one of:"
	@awk -F ':.*## ' '/^[a-zA-Z][a-zA-Z0-9_-]*:.*## / {printf "  %-17s %s\n", $$1, $$2}' $(firstword $(MAKEFILE_LIST))

.PHONY: help demo test check setup setup-matrix install-matrix debian install build-c ctest ctest-ffi-oldest ctest-ffi-newest ctest-asan \
  ctest-tsan ctest-valgrind fuzz pytest pytest-matrix test-install typecheck bench bench-smoke \
  format format-check clean gpu-wheels install-gpu test-gpu bench-gpu gpu-check

# The demo installs what it needs alone, saying what it does: a C compiler
# and Python 3.11 with venv and headers (tools/demo-needs: apt-get only
# where one is missing), then requirements/demo.txt into .venv, then the
# package.  What it shows: README.md, "Two commands".
demo: $(VENV)/.demo-deps ## set up what the demo needs (no apt-get where the tools are there) and run examples/demo.py
	@echo "== building host_callback's C runtime and installing it into $(VENV) (a minute the first time)"
	$(call PIP_INSTALL,$(VENV))
	@echo "== running examples/demo.py"
	$(PY) examples/demo.py

$(VENV)/.demo-deps: requirements/demo.txt
	@tools/demo-needs
	@echo "== making the virtualenv $(VENV) with Python 3.11"
	test -x $(PY) || $$(tools/find-python $(call PYVER,$(MAIN))) -m venv $(VENV)
	@echo "== installing $< into $(VENV): jax, jaxlib, numpy, the build tools (a minute or two)"
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install --progress-bar off -r $<
	touch $@

# Two cores: first the virtualenvs (downloads, mostly waiting on the
# network) and the package built into each, beside the C builds and tests,
# the fuzzer, mypy and the pip install tests (downloads too), four targets
# at a time; then each Python suite on both cores.  The pip install tests
# go last in that list: they take the slot the C checks leave (first, they
# held one while the C checks waited, and the phase took 498 s, not 455 s).
test: ## set up everything and run every test (what CI runs; 38 minutes in a clean clone on 2 cores)
	$(MAKE) -j4 --output-sync=target install install-matrix format-check typecheck ctest ctest-ffi-oldest \
	  ctest-ffi-newest ctest-asan ctest-tsan ctest-valgrind fuzz test-install
	$(MAKE) INSTALLED=1 pytest pytest-matrix

# The fast loop: the C tests, then the Python tests of the public API and the
# docs (tests/python/conftest.py, CHECK_FILES), on both cores.
check: install ## the fast loop: the C tests and the main Python tests on .venv (about a minute)
	$(MAKE) ctest
	$(PY) $(PYTEST) -m check tests/python

# ---- setup ------------------------------------------------------------------
debian: ## install the Debian packages that make test needs (DEBIAN_PACKAGES), with apt-get
	@missing=""; for p in $(DEBIAN_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq $$missing; fi

# A virtualenv per combination, with its pins (.venv for the first).
$(VENV)/.deps: requirements/$(MAIN).txt | debian
	test -x $(PY) || $$(tools/find-python $(call PYVER,$(MAIN))) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r $<
	touch $@

# (Make would delete these stamps as intermediate files of pytest-py%.)
.PRECIOUS: .venv-%/.deps
.venv-%/.deps: requirements/%.txt | debian
	test -x .venv-$*/bin/python || $$(tools/find-python $(call PYVER,$*)) -m venv .venv-$*
	.venv-$*/bin/python -m pip install -q --upgrade pip
	.venv-$*/bin/python -m pip install -q -r $<
	touch $@

setup: $(VENV)/.deps ## make .venv with the pinned packages of the development environment

setup-matrix: $(foreach m,$(MATRIX),.venv-$(m)/.deps) ## make the virtualenvs of the other supported Python/JAX combinations

install: setup ## build the C runtime and install host_callback into .venv
	$(call PIP_INSTALL,$(VENV))

# ---- C tests ----------------------------------------------------------------
# The plain build (ctest and ctest-valgrind run its tests).
build-c: setup ## build libhcb and the C tests (build/c)
	$(CMAKE_C) -B build/c -DCMAKE_BUILD_TYPE=Debug >/dev/null
	cmake --build build/c

ctest: build-c ## the C tests
	ctest --test-dir build/c --output-on-failure

# The same tests built against the oldest and the newest supported XLA FFI
# headers (the first and the last combination's jaxlib, FFI API 0.1 and
# 0.5) besides .venv's (0.3): what differs by header version
# (include/hcb/ffi_version.h) is checked with each.
FFI_INC = $$($(1) -c "import jax.ffi; print(jax.ffi.include_dir())")
OLDEST_PY = .venv-$(firstword $(MATRIX))/bin/python
NEWEST_PY = .venv-$(lastword $(MATRIX))/bin/python
ctest-ffi-oldest: .venv-$(firstword $(MATRIX))/.deps setup ## the C tests against the oldest supported JAX's XLA FFI header
	$(CMAKE_C) -B build/c-ffi-oldest -DCMAKE_BUILD_TYPE=Debug -DHCB_XLA_INCLUDE_DIR=$(call FFI_INC,$(OLDEST_PY)) >/dev/null
	cmake --build build/c-ffi-oldest
	ctest --test-dir build/c-ffi-oldest --output-on-failure
ctest-ffi-newest: .venv-$(lastword $(MATRIX))/.deps setup ## the C tests against the newest supported JAX's XLA FFI header
	$(CMAKE_C) -B build/c-ffi-newest -DCMAKE_BUILD_TYPE=Debug -DHCB_XLA_INCLUDE_DIR=$(call FFI_INC,$(NEWEST_PY)) >/dev/null
	cmake --build build/c-ffi-newest
	ctest --test-dir build/c-ffi-newest --output-on-failure

ctest-asan: setup ## the C tests under AddressSanitizer and UBSan (clang)
	$(CMAKE_C) -B build/asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang -DHCB_SANITIZE=address >/dev/null
	cmake --build build/asan
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir build/asan --output-on-failure

ctest-tsan: setup ## the C tests under ThreadSanitizer (clang)
	$(CMAKE_C) -B build/tsan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang -DHCB_SANITIZE=thread >/dev/null
	cmake --build build/tsan
	TSAN_OPTIONS=halt_on_error=1 ctest --test-dir build/tsan --output-on-failure

# The plain build's C tests under valgrind's memcheck: reads of uninitialised
# memory (which no sanitizer here sees) and definite leaks.  HCB_VALGRIND=1
# skips the two cases whose premise valgrind does not give (test_print's
# flush-to-zero, test_ffi_cuda_pool's stream that never makes a tap wait).
ctest-valgrind: build-c ## the C tests under valgrind
	for t in build/c/test_*; do log=build/c/valgrind-$${t##*/}.log; echo "valgrind $$t"; \
	  HCB_VALGRIND=1 timeout 900 valgrind -q --error-exitcode=99 --leak-check=full \
	    --errors-for-leak-kinds=definite --show-leak-kinds=definite $$t >$$log 2>&1 \
	  || { cat $$log; echo "valgrind $$t failed"; exit 1; }; done

# ---- fuzzing (clang's libFuzzer) --------------------------------------------
# A short run from the committed seeds in fuzz/corpus/print; what it learns
# goes to build/fuzz/corpus, a crashing input to build/fuzz/ (and fails).
fuzz: setup ## a short run of the fuzzers (libFuzzer)
	cmake -S . -G Ninja -B build/fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
	  -DHCB_BUILD_FUZZERS=ON -DHCB_WERROR=ON -DPython_EXECUTABLE=$(abspath $(PY)) >/dev/null
	cmake --build build/fuzz --target fuzz_print
	mkdir -p build/fuzz/corpus/print
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 build/fuzz/fuzz_print \
	  -max_total_time=20 -rss_limit_mb=2048 -artifact_prefix=build/fuzz/ \
	  build/fuzz/corpus/print fuzz/corpus/print

# ---- Python tests -----------------------------------------------------------
pytest: $(if $(INSTALLED),setup,install) ## the Python tests on .venv
	$(PY) $(PYTEST) tests/python

# The Python suite on the other supported JAX versions, each with a package
# built against its own jaxlib's XLA FFI header, but the last (newest) and
# the first (oldest) combination's, built against each other's: a binary
# built against the oldest supported header (JAX 0.6.2's, FFI 0.1) must
# register and run under the newest JAX, and one built against the newest
# (JAX 0.12's, FFI 0.5: what `pip install` with build isolation builds
# against, whatever jaxlib is installed) under the oldest.  Every test runs on
# each but the benchmark harness's own (marked `bench`: make bench runs on
# .venv alone) and the checks of the repository itself (marked `repo`: the
# Makefile's commands, the C layers); the few that repeat a scenario
# hundreds of times to catch a rare race (an exit, a barrier), or draw
# thousands of random inputs (the printer against numpy), do a fifth as
# much there (HOST_CALLBACK_TEST_REPEAT, tests/python/conftest.py).
MATRIX_REPEAT ?= 0.2
pytest-matrix: $(addprefix pytest-,$(MATRIX)) ## the Python tests on every other supported combination

install-matrix: $(addprefix install-,$(MATRIX)) ## build and install the package into every other combination's venv

install-py%: .venv-py%/.deps .venv-$(firstword $(MATRIX))/.deps .venv-$(lastword $(MATRIX))/.deps
	$(if $(filter py$*,$(lastword $(MATRIX))),HCB_XLA_INCLUDE_DIR=$(call FFI_INC,$(OLDEST_PY))) \
	  $(if $(filter py$*,$(firstword $(MATRIX))),HCB_XLA_INCLUDE_DIR=$(call FFI_INC,$(NEWEST_PY))) \
	  $(call PIP_INSTALL,.venv-py$*)

# Each suite installs the package first, but in make test, whose first step
# installed every one (INSTALLED=1).
pytest-py%: $(if $(INSTALLED),,install-py%) .venv-py%/.deps setup
	HOST_CALLBACK_TEST_REPEAT=$(MATRIX_REPEAT) .venv-py$*/bin/python $(PYTEST) -m "not bench and not repo" tests/python

# `pip install .` as a user runs it: build isolation, a fresh venv, PyPI.
# Its three tests run at once (much of their time is downloads).
test-install: setup ## pip install . into fresh virtualenvs, as a user would
	$(PY) -m pytest -q -p no:cacheprovider -n 3 tests/install

# ---- client libraries (tests/clients; docs/migrating.md) ---------------------
# Pinned releases of libraries that use JAX's callbacks, run unchanged with
# JAX's callbacks and patched to host_callback's, compared case by case:
# .venv-clients (requirements/clients.txt) for those that run on current
# JAX, .venv-clients-legacy (requirements/clients-legacy.txt) for code
# written for the removed jax.experimental.host_callback.  Not part of
# `make test` (about 10 minutes on two cores, and a venv of its own).
CLIENT_VENVS := .venv-clients .venv-clients-legacy
.PHONY: test-clients install-clients bench-clients

$(addsuffix /.deps,$(CLIENT_VENVS)): .venv-clients%/.deps: requirements/clients%.txt | debian
	test -x .venv-clients$*/bin/python || $$(tools/find-python $(call PYVER,$(MAIN))) -m venv .venv-clients$*
	.venv-clients$*/bin/python -m pip install -q --upgrade pip
	.venv-clients$*/bin/python -m pip install -q -r $<
	touch $@

install-clients: $(addsuffix /.deps,$(CLIENT_VENVS)) setup ## make the virtualenvs of the client libraries (tests/clients)
	$(call PIP_INSTALL,.venv-clients)
	$(call PIP_INSTALL,.venv-clients-legacy)

test-clients: install-clients ## real libraries' tests, patched onto host_callback
	.venv-clients/bin/python -m pytest -q -p no:cacheprovider tests/clients

# ---- type checks ([tool.mypy] in pyproject.toml) ---------------------------
# The package as pip installed it in .venv (its modules, _hcb.pyi, py.typed),
# the benchmark harness, then, strictly, a user program that uses every
# example of README.md and docs/api.md.
typecheck: install ## mypy, strict, over the package and the examples of README.md and docs/api.md
	$(PY) -m mypy -p host_callback
	$(PY) -m mypy bench/
	$(PY) -m mypy --strict tests/typing/readme_examples.py

# ---- benchmarks (bench/README.md) -------------------------------------------
bench: install install-clients ## the benchmarks against JAX's callbacks: bench/results/RESULTS.md (builds the client virtualenvs the first time)
	$(PY) bench/run.py --clients-python .venv-clients/bin/python

# Section 9 of make bench alone: the client libraries' workloads, patched
# against unpatched (bench/README.md).
bench-clients: install install-clients ## section 9 of make bench alone: client libraries, patched against unpatched
	$(PY) bench/run.py --clients-only --clients-python .venv-clients/bin/python

bench-smoke: install ## a seconds-long run of the benchmarks (numbers mean nothing)
	$(PY) bench/run.py --smoke --out build/bench-smoke

# ---- GPU (docs/gpu.md) ------------------------------------------------------
# The GPU machines are offline and bring Python 3.12 with JAX 0.11.2, its CUDA 13
# plugin, CuPy, pytest and scikit-build-core: the package is built into that
# Python (GPU_PY) without build isolation.  A package missing there is installed
# from build/gpu-wheels, which `make gpu-wheels` fills on a machine with network
# (the wheels are pure Python; the pins are those of requirements/py3.12-*.txt).
GPU_PY ?= python3
GPU_WHEELS := build/gpu-wheels
GPU_PACKAGES := scikit-build-core pytest pytest-timeout
GPU_PINS := scikit-build-core==1.1.2 pytest==9.2.0 pytest-timeout==2.4.0

gpu-wheels: ## where there is network: the wheels the GPU targets install offline
	mkdir -p $(GPU_WHEELS)
	$(if $(wildcard $(PY)),$(PY),python3) -m pip download -q --only-binary=:all: \
	  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
	  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d $(GPU_WHEELS) $(GPU_PINS)
	ls $(GPU_WHEELS)

install-gpu: ## on a GPU machine: build and install into its Python, offline
	@$(GPU_PY) -c "import jax, sys; sys.exit(0 if jax.default_backend() == 'gpu' else \
	  'make $@: JAX sees no GPU here (default backend ' + repr(jax.default_backend()) + ')')"
	if [ -d $(GPU_WHEELS) ]; then $(GPU_PY) -m pip install -q --no-index \
	  --find-links $(GPU_WHEELS) $(GPU_PACKAGES); fi
	$(GPU_PY) -m pip install -q --no-build-isolation --no-deps \
	  --config-settings=build-dir=build/py-gpu .

# Every API on the GPU (tests/gpu; they fail rather than skip without one),
# then the CuPy example.
test-gpu: install-gpu ## on a GPU machine: the GPU suite and the CuPy example
	HCB_REQUIRE_GPU=1 XLA_PYTHON_CLIENT_PREALLOCATE=false \
	  $(GPU_PY) -m pytest -q -p no:cacheprovider tests/gpu
	$(GPU_PY) examples/cupy_buffer_callback.py

# The GPU targets (bench/README.md, "GPU"): writes bench/results/RESULTS-gpu.md.
bench-gpu: install-gpu ## on a GPU machine: the GPU benchmarks (bench/results/RESULTS-gpu.md)
	JAX_PLATFORMS=cuda,cpu $(GPU_PY) bench/run.py --gpu

# The one command for a GPU machine (tools/gpu_check.py): checks that JAX
# sees a GPU, builds the package offline into GPU_PY, then runs the GPU
# suite, the CuPy example, the probes of tests/gpu/probes and the GPU
# benchmarks, each under its own timeout, in at most 8 minutes; one summary
# line per check, logs and RESULTS-gpu.md in GPU_CHECK_DIR (bring it back).
# Without a GPU it fails at once; HCB_GPU_DRY_RUN=1 runs it on the CPU.
GPU_CHECK_DIR ?= build/gpu-check
gpu-check: ## on a GPU machine: everything GPU, in at most 8 minutes (docs/gpu.md)
	$(GPU_PY) tools/gpu_check.py --python $(GPU_PY) --out $(GPU_CHECK_DIR)

format: ## clang-format the C sources in place
	clang-format -i $(C_SOURCES)

format-check: ## check the C sources' formatting
	clang-format --dry-run --Werror $(C_SOURCES)

clean: ## remove the build outputs
	rm -rf build
