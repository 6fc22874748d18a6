# Two commands on a fresh machine:  make serve   and   make test
# Everything else is installed on demand (the venv, system packages the build needs).

SHELL := /bin/bash
# The venv's interpreter: the first python3 every user can run (scripts/pick-python), so
# that a service's own user can run the venv too (docs/operations.md).
PYTHON ?= $(shell scripts/pick-python)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CC ?= gcc
# The core's sources by folder (storage_c/src/log, codec, port; they include each other's
# headers as "port/port.h", hence -Istorage_c/src) and its two public headers.
CSRC := $(wildcard storage_c/src/*/*.c)
CHDR := $(wildcard storage_c/src/*/*.h) storage_c/include/comet.h storage_c/include/comet_testing.h
CFLAGS_COMMON := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Istorage_c/include -Istorage_c/src
SAN := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
BUILD := build/c
CTESTS := $(patsubst storage_c/tests/%.c,$(BUILD)/%,$(wildcard storage_c/tests/test_*.c))

.PHONY: test check serve system-deps test-deps docker-deps venv ctest pytest bench clean locust-venv loadtest soak

# $(call beside,LOG,BACKGROUND,FOREGROUND): two shell commands side by side, one on each of
# the two cores; BACKGROUND's output goes to LOG, printed once both ended, so the two never
# mix.  Fails when either failed, and says which (no commas inside the commands: make's call).
beside = mkdir -p $(dir $(1)); \
	( $(2) ) > $(1) 2>&1 < /dev/null & background=$$!; \
	( $(3) ); fg=$$?; wait $$background; bg=$$?; \
	echo "== $(1), from the background:"; cat $(1); \
	[ $$bg -eq 0 ] || echo "make $@: failed in the background (exit $$bg): $(1) above"; \
	[ $$fg -eq 0 ] || echo "make $@: failed in the foreground (exit $$fg): above $(1)"; \
	[ $$bg -eq 0 ] && [ $$fg -eq 0 ]

# A scratch directory for the C tests on /dev/shm when it has 2 GiB free, else under
# TMPDIR: the tests sync thousands of times, which a shared disk turns into minutes.
fast_scratch = scratch=$$(df --output=avail -k /dev/shm 2>/dev/null | \
	  awk 'NR == 2 && $$1 > 2097152 {print "/dev/shm"}'); \
	scratch=$$(mktemp -d "$${scratch:-$${TMPDIR:-/tmp}}/comet-ctest.XXXXXX") || exit 1

# `make test`: the C tiers (built from storage_c alone: no venv) in the background; in the
# foreground the two venvs (side by side), mypy and pytest on PYTEST_WORKERS workers
# (pytest-xdist; tests/conftest.py keeps the Spark tests on one worker, the Docker tests on
# one).  Two workers: the JVMs, the power-cut filesystems and the C tiers keep both cores busy.
# The C tests under ASan/UBSan write on the disk (TMPDIR), as a deployment does; under TSan
# and for coverage, where what counts is the code they run, on fast_scratch.
PYTEST_WORKERS ?= 2
test: system-deps test-deps
	@$(fast_scratch); \
	$(call beside,build/logs/c-tiers.log,\
	  $(MAKE) --no-print-directory ctest && \
	  COMET_TEST_TMP=$$scratch $(MAKE) --no-print-directory tsan coverage && \
	  $(MAKE) --no-print-directory append-budget,\
	  $(MAKE) --no-print-directory -j2 $(STAMP) locust-venv && \
	  $(MAKE) --no-print-directory typecheck pytest); \
	rc=$$?; \
	rm -rf "$$scratch"; exit $$rc

# The quick tier, for a change under way (under 3 minutes on 2 cores with a warm .venv and
# build): the C tests under ASan/UBSan, the append's instruction budget, mypy, and every
# pytest test that needs no Java,
# Docker, FUSE or Swift and is no long crash, multi-process or load test (the marks are
# assigned in tests/conftest.py).  It installs none of those; `make test` runs everything.
# The C tests and the budget run in the background (build/logs/check-c.log) beside mypy and
# pytest on CHECK_WORKERS workers: three, as these tests wait on their servers and
# subprocesses often enough to leave a third one room (four are no faster).
# The C tests' scratch directories are on fast_scratch.
QUICK_TESTS := not (spark or docker or fuse or swift or slow)
CHECK_WORKERS ?= 3
check: system-deps $(STAMP)
	@$(fast_scratch); \
	$(call beside,build/logs/check-c.log,\
	  COMET_TEST_TMP=$$scratch $(MAKE) --no-print-directory ctest && \
	  $(MAKE) --no-print-directory append-budget,\
	  $(MAKE) --no-print-directory typecheck && \
	  $(PY) -m pytest -n $(CHECK_WORKERS) --dist loadgroup -m "$(QUICK_TESTS)" $(PYTEST_ARGS)); \
	rc=$$?; \
	rm -rf "$$scratch"; exit $$rc

# `make serve PORT=8081 HOST=0.0.0.0 DATA=/srv/comet`: taken from make's command line
# only, never from the environment, where HOST is often the machine's name.
command_line = $(if $(filter command line,$(origin $(1))),$($(1)),$(2))
SERVE_PORT = $(call command_line,PORT,8080)
SERVE_HOST = $(call command_line,HOST,127.0.0.1)
SERVE_DATA = $(call command_line,DATA,./data)
serve: system-deps $(STAMP)
	$(VENV)/bin/comet serve --data-dir $(SERVE_DATA) --host $(SERVE_HOST) --port $(SERVE_PORT)

# Debian packages the C core builds against, and valgrind, which counts the append's
# instructions (append-budget) (idempotent; needs root or sudo).
system-deps:
	@if [ ! -f /usr/include/zstd.h ]; then \
	  echo "installing libzstd-dev"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get install -y -q libzstd-dev >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q libzstd-dev >/dev/null; }; \
	fi
	@if [ ! -f /usr/include/valgrind/callgrind.h ]; then \
	  echo "installing valgrind"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get install -y -q valgrind >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q valgrind >/dev/null; }; \
	fi

# What only the tests need (idempotent; scripts/apt-install.sh installs what is missing):
# Java for Spark's JVM; OpenStack Swift, the real S3 of tests/test_spark_swift.py
# (tests/support/swift_server.py); and docker-deps.
SWIFT_PACKAGES := swift swift-proxy swift-object swift-container swift-account
test-deps: docker-deps
	@scripts/apt-install.sh openjdk-17-jre-headless $(SWIFT_PACKAGES)
	@scripts/install-fuse.sh

# Docker (Debian's docker.io and debootstrap) and the local base image of docker/Dockerfile
# (debootstrap, cached: no image registry needed).  A private dockerd started for this is
# stopped again; tests/test_docker.py starts and stops its own.  See docs/docker.md.
docker-deps:
	@scripts/build-base-image.sh

venv: $(STAMP)

# libzstd-dev first, whatever asks for the venv (`make venv` as much as `make serve`).
# EXTRAS: the optional dependencies installed with the project (pyproject.toml):
# dev (everything the tests need, the default), spark (comet spark-ship), or none
# (EXTRAS=: the gateway, comet ship and the inspection commands), for a service.
# PYTHON (above): the interpreter the venv links to; a service's user must be able to
# run it (scripts/venv-reach.py says when it cannot).
EXTRAS ?= dev
$(STAMP): pyproject.toml setup.py storage_c/_build.py storage_c/_fastpath.c $(CSRC) $(CHDR) | system-deps
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel cffi
	$(PY) -m pip install -q --no-build-isolation -e '.$(if $(EXTRAS),[$(EXTRAS)])'
	@$(PY) scripts/venv-reach.py
	@touch $(STAMP)

# C tests of the core, under AddressSanitizer and UndefinedBehaviorSanitizer.  Each
# build flavour compiles the core once (build/obj/FLAVOUR/) and links every test to it.
TEST_HDR := storage_c/tests/check.h storage_c/tests/util.h
objects = $(patsubst storage_c/src/%.c,build/obj/$(1)/%.o,$(CSRC))
.SECONDARY: $(call objects,asan) $(call objects,tsan)   # kept for the next build
ctest: $(CTESTS)
	@set -e; for t in $(CTESTS); do echo "$$t"; ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 $$t; done

build/obj/asan/%.o: storage_c/src/%.c $(CHDR)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_COMMON) $(SAN) -c $< -o $@

$(BUILD)/%: storage_c/tests/%.c $(call objects,asan) $(TEST_HDR)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_COMMON) $(SAN) $(call objects,asan) $< -o $@ -lzstd -lpthread

# The same C tests under ThreadSanitizer (the races: appenders, readers, the
# background flusher and retention, close).
TSAN_BUILD := build/tsan
TSAN_TESTS := $(patsubst storage_c/tests/%.c,$(TSAN_BUILD)/%,$(wildcard storage_c/tests/test_*.c))
.PHONY: tsan coverage
tsan: $(TSAN_TESTS)
	@set -e; for t in $(TSAN_TESTS); do echo "$$t"; TSAN_OPTIONS=halt_on_error=1 $$t >/dev/null; done

TSAN := -O1 -g -fsanitize=thread
build/obj/tsan/%.o: storage_c/src/%.c $(CHDR)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_COMMON) $(TSAN) -c $< -o $@

$(TSAN_BUILD)/%: storage_c/tests/%.c $(call objects,tsan) $(TEST_HDR)
	@mkdir -p $(TSAN_BUILD)
	$(CC) $(CFLAGS_COMMON) $(TSAN) $(call objects,tsan) $< -o $@ -lzstd -lpthread

# Instructions per append call of 1, 10, 100 and 1000 entries (loadtests/c/bench_append.c,
# counted by callgrind: deterministic, not a timed test) against the budgets committed in
# storage_c/tests/append_budget.txt: more than its tolerance over one fails with the figures.
# The core is compiled as the cffi module compiles it (storage_c/_build.py and CPython's flags).
# `make append-budget APPEND_BUDGET_ARGS=--update` rewrites the budgets from this run.
BENCH_BUILD := build/bench
BENCH_CFLAGS := -std=c11 -D_GNU_SOURCE -O2 -g -fwrapv -fPIC -fvisibility=hidden -DNDEBUG \
  -Wall -Wextra -Werror -Istorage_c/include -Istorage_c/src
APPEND_BUDGET_ARGS ?=
.PHONY: append-budget
.SECONDARY: $(call objects,bench)
append-budget: system-deps $(BENCH_BUILD)/bench_append
	@$(PYTHON) storage_c/tests/append_budget.py $(BENCH_BUILD)/bench_append \
	  storage_c/tests/append_budget.txt $(APPEND_BUDGET_ARGS)

build/obj/bench/%.o: storage_c/src/%.c $(CHDR)
	@mkdir -p $(@D)
	$(CC) $(BENCH_CFLAGS) -c $< -o $@

$(BENCH_BUILD)/bench_append: loadtests/c/bench_append.c $(call objects,bench)
	@mkdir -p $(@D)
	$(CC) $(BENCH_CFLAGS) $(call objects,bench) $< -o $@ -lzstd -lpthread

# Line coverage of storage_c/src by the C tests (gcov), printed as one figure per
# file (of every folder) and a total; the report is build/coverage/summary.txt.  The core is compiled
# once (build/coverage/core/); every test's run adds its counts to the same .gcda files.
# The total may not fall below COVERAGE_MIN (percent): new C code comes with its tests.
# (Runs differ by a few lines, 89.2-89.5 %: some paths depend on timing; the floor leaves them room.)
COV_BUILD := build/coverage
COVERAGE_MIN := 88.5
coverage:
	@rm -rf $(COV_BUILD) && mkdir -p $(COV_BUILD)/core $(COV_BUILD)/tests
	@set -e; for c in $(CSRC); do \
	  $(CC) $(CFLAGS_COMMON) -O0 --coverage -c $$c -o $(COV_BUILD)/core/$$(basename $$c .c).o; done
	@set -e; for t in storage_c/tests/test_*.c; do n=$$(basename $$t .c); \
	  $(CC) $(CFLAGS_COMMON) -O0 --coverage $(COV_BUILD)/core/*.o $$t -o $(COV_BUILD)/tests/$$n \
	    -lzstd -lpthread && \
	  (cd $(COV_BUILD)/tests && ./$$n > $$n.log 2>&1) || \
	  { echo "make coverage: $$n failed ($(COV_BUILD)/tests/$$n.log):"; \
	    tail -n 30 $(COV_BUILD)/tests/$$n.log; exit 1; }; done
	@set -o pipefail; $(PYTHON) scripts/coverage-summary.py $(COV_BUILD) storage_c/src \
	  --min $(COVERAGE_MIN) | tee $(COV_BUILD)/summary.txt

# The type checker over the Python packages and their tests ([tool.mypy] in pyproject.toml).
.PHONY: typecheck
typecheck: $(STAMP)
	$(PY) -m mypy

# On PYTEST_WORKERS workers (PYTEST_WORKERS=0: in one process), tests/conftest.py's groups
# each on one worker (--dist loadgroup).
pytest: $(STAMP)
	@set +e; $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests selected"; rc=0; fi; exit $$rc

# locust in a virtualenv of its own (it monkey-patches the standard library with
# gevent); idempotent: reinstalled only when loadtests/requirements-locust.txt changes.
LOCUST_VENV := .venv-locust
LOCUST_STAMP := $(LOCUST_VENV)/.installed
locust-venv: $(LOCUST_STAMP)

$(LOCUST_STAMP): loadtests/requirements-locust.txt
	@test -x $(LOCUST_VENV)/bin/python || $(PYTHON) -m venv $(LOCUST_VENV)
	$(LOCUST_VENV)/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(LOCUST_VENV)/bin/python -m pip install -q --disable-pip-version-check -r loadtests/requirements-locust.txt
	@touch $(LOCUST_STAMP)

# Locust against `comet serve` (2 workers), then every acknowledged event checked in the log;
# results in loadtests/results/loadtest.json and loadtest_*.csv.  LOADTEST_ARGS: more options
# of loadtests/loadtest.py (--help), e.g. LOADTEST_ARGS="--max-p95-ms 200 BatchUser".
LOADTEST_SECONDS ?= 60
LOADTEST_USERS ?= 16
SOAK_SECONDS ?= 300
LOADTEST_ARGS ?=
loadtest: system-deps $(STAMP) $(LOCUST_STAMP)
	$(PY) -m loadtests.loadtest --run-time $(LOADTEST_SECONDS) --users $(LOADTEST_USERS) $(LOADTEST_ARGS)

# The same, paced, for SOAK_SECONDS with retention on and `comet ship` draining into a
# directory: disk use and the consumer's lag sampled and bounded (loadtests/results/soak*).
soak: system-deps $(STAMP) $(LOCUST_STAMP)
	$(PY) -m loadtests.loadtest --soak --run-time $(SOAK_SECONDS) $(LOADTEST_ARGS)

bench: system-deps bench-deps $(STAMP)
	$(PY) -m loadtests.bench_storage
	$(PY) -m loadtests.bench_consumers
	$(PY) -m loadtests.bench_gateway
	$(PY) -m loadtests.bench_spark
	$(PY) -m loadtests.bench_otlp
	$(PY) -m loadtests.bench_forward
	$(PY) -m loadtests.report

# The docs site from README.md and docs/ (mkdocs.yml) into site/: open site/index.html.
# --strict: a page missing from the nav, or a broken link or anchor, fails the build.
.PHONY: docs
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# loadtests/results/REPORT.md and storage_batch.png from the existing results (no benchmark run).
.PHONY: report
report: $(STAMP)
	$(PY) -m loadtests.report

clean:
	rm -rf build site $(VENV) $(LOCUST_VENV) storage_c/_comet*.so storage_c/_fastpath*.so storage_c/_comet.c .pytest_cache .bench-tmp

# wrk, the HTTP load generator of loadtests/bench_gateway.py (idempotent; needs root or sudo).
# The benchmark runs the same steps itself when wrk is missing.
.PHONY: bench-deps
bench-deps:
	@if ! command -v wrk >/dev/null 2>&1; then \
	  echo "installing wrk"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get install -y -q wrk >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q wrk >/dev/null; }; \
	fi
