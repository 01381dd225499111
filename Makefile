# Every target creates .venv and installs the project into it first, so a fresh clone needs only `make`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

# The tests start hundreds of Python processes (real writers, readers, hosts, services): with bytecode
# caching off (PYTHONDONTWRITEBYTECODE, which some container images set), each of them compiles chronq,
# wire and rpc from source again, about 0.1 s apiece (the pytest part of `make test` took 5 min 44 s
# that way, 4 min 50 s with it on). The recipes run with it on: __pycache__ is ignored by git.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-pythons test-slow test-pure test-interop test-asan asan-build fuzz lint typecheck unit bench bench-plots docs build clean

# editable_mode=compat: a path entry (.pth) rather than setuptools' import hook, which static checkers
# (mypy, pyright) cannot follow: user code outside the tree then type-checks against chronq and rpc
# (tests/test_editable_install.py). setuptools calls compat transitional; should it go, `strict` (a tree
# of links, to reinstall after adding a module) is the mode checkers also see.
EDITABLE := --config-settings editable_mode=compat

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,spark,docs,archive,archive-test,codecs,cli]' $(EDITABLE)
	touch $(STAMP)

# Rebuilds the C extensions in place when their sources changed (setuptools skips up-to-date ones).
build: $(STAMP)
	$(PY) setup.py -q build_ext --inplace

demo: build
	$(PY) examples/demo.py

lint: build
	$(VENV)/bin/ruff check wire chronq rpc tests examples benchmarks

typecheck: build
	$(VENV)/bin/mypy --strict wire chronq rpc

# pytest-xdist: one worker per core (XDIST=-n 0 runs in this process); --dist loadgroup keeps each
# xdist_group in one worker (the Spark tests share one JVM, the `exclusive` ones never run beside each
# other: tests/conftest.py). The slowest tests are listed: a new one over a few seconds belongs in `slow`
# or needs a cheaper default version.
XDIST ?= -n auto --dist loadgroup

unit: build
	$(PY) -m pytest -q $(XDIST) --durations=25

test: lint typecheck unit

# pytest exits 5 when nothing is marked slow; that is not a failure. The durations are the figures
# docs/guarantees.md quotes.
test-slow: build
	$(PY) -m pytest -q $(XDIST) -m slow --durations=0 --durations-min=5 || [ $$? -eq 5 ]

# The sdist and wheel `python -m build` makes carry the C modules, stubs, markers, shim, entry points and
# licence, and the sdist builds with and without OpenSSL's headers (tests/test_wheel.py); then each of
# Python 3.11, 3.12 and 3.13 (pyenv's) builds its wheel, installs it into a clean virtualenv and runs the
# suite against it (noxfile.py). A missing 3.12 or 3.13 is said and skipped; a missing 3.11 fails.
# PYTHONS picks some of them (`make test-pythons PYTHONS="3.12 3.13"`).
PYTHONS ?= 3.11 3.12 3.13
test-pythons: $(STAMP)
	$(PY) -m pytest -q -m wheel tests/test_wheel.py
	$(VENV)/bin/nox -s $(addprefix tests-,$(PYTHONS))

# Real Java Chronicle Queue 5.26 reads, resumes, method-reads and appends to queues chronq wrote
# (../shared/java/run.sh, needs a JDK 17). run.sh installs the Debian jars Chronicle needs on first use
# when it runs as root (apt-get); otherwise the tests skip, naming the packages (fail under CHRONQ_STRICT=1).
test-interop: build
	$(PY) -m pytest -q $(XDIST) -m interop

# The wire and rpc suites again on the pure-Python reference codec (what runs where the C
# accelerator cannot be built); the differential tests then compare it with nothing but itself.
test-pure: build
	WIRE_NO_SPEEDUPS=1 $(PY) -m pytest -q $(XDIST) tests/test_wire_binary.py tests/test_wire_typed.py \
		tests/test_wire_text.py tests/test_wire_history.py tests/test_wire_wiretypes.py tests/test_wire_fuzz.py tests/test_wire_bounds.py tests/test_wire_fields.py \
		tests/test_rpc_reader.py tests/test_rpc_writer.py tests/test_rpc_history.py tests/test_rpc_java_queues.py \
		tests/test_rpc_service.py tests/test_rpc_wires.py tests/test_rpc_fuzz.py tests/test_rpc_dispatch_scope.py \
		tests/test_wire_fieldless.py tests/test_wire_record.py

# Sanitizers: the C modules built with AddressSanitizer and UndefinedBehaviorSanitizer in a copy of the
# tree (build/asan/tree: the in-place modules of this tree would otherwise be imported first), then the
# suites that drive them run against that copy; subprocesses inherit the environment. The interpreter
# is not sanitized, so libasan is preloaded; CPython's deliberate leaks are not reported. Reports go to
# build/asan/logs (also those of subprocesses whose exit a test tolerates) and fail the target. Spark
# tests are left out: a JVM started with libasan preloaded hangs.
ASAN_TREE  := build/asan/tree
ASAN_LOGS  := $(abspath build/asan/logs)
ASAN_ENV   = LD_PRELOAD=$$(gcc -print-file-name=libasan.so) PYTHONPATH=. \
	ASAN_OPTIONS=detect_leaks=0:log_path=$(ASAN_LOGS)/asan \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:log_path=$(ASAN_LOGS)/ubsan
ASAN_TESTS := tests/test_native.py tests/test_queue_model.py tests/test_appender.py tests/test_tailer.py \
	tests/test_corrupt.py tests/test_wire_*.py tests/test_rpc_fastpath.py tests/test_rpc_fuzz.py \
	tests/test_rpc_reader.py tests/test_rpc_writer.py tests/test_rpc_history.py tests/test_rpc_wires.py \
	tests/test_rpc_service.py tests/test_rpc_java_queues.py tests/test_table_store.py \
	tests/test_format_vectors.py tests/test_headerless.py tests/test_rollcycles.py tests/test_atomic.py \
	tests/test_merge.py
ASAN_TESTS += tests/test_codecs.py tests/test_codecs_batch.py  # chronq._codecs (AES-GCM through OpenSSL)
# fails the recipe if a sanitizer wrote a report
ASAN_CHECK = if ls $(ASAN_LOGS)/* >/dev/null 2>&1; then cat $(ASAN_LOGS)/*; echo "sanitizer reports in $(ASAN_LOGS)"; exit 1; fi
ASAN_TESTS += tests/test_replication_runs.py tests/test_replication_protocol.py  # replication runs (read_run, write_run)
ASAN_TESTS += tests/test_doorbell.py tests/test_doorbell_model.py tests/test_rpc_aio.py  # the doorbell, its notifier, io_uring

asan-build: build
	rm -rf $(ASAN_TREE) && mkdir -p $(ASAN_TREE)
	tar -c --exclude='*.so' --exclude=__pycache__ chronq wire rpc tests examples docs benchmarks \
		pyproject.toml setup.py pyspark_chronq.py README.md | tar -x -C $(ASAN_TREE)
	ln -sfn $(abspath ..)/shared build/asan/shared  # ../shared as seen from the copy's tests
	cd $(ASAN_TREE) && CHRONQ_SANITIZE=1 $(abspath $(PY)) setup.py -q build_ext --inplace

test-asan: asan-build
	rm -rf $(ASAN_LOGS) && mkdir -p $(ASAN_LOGS)
	cd $(ASAN_TREE) && $(ASAN_ENV) $(abspath $(PY)) -m pytest -q $(XDIST) -m 'not slow and not interop and not spark' \
		$(ASAN_TESTS); rc=$$?; \
		$(ASAN_CHECK); exit $$rc

# Coverage-guided fuzzing (atheris) of the cycle-file reader, the table store and the wire decoders,
# FUZZ_SECONDS per harness on the regular build (libasan would take libFuzzer's coverage hooks), then
# the whole grown corpus replayed on the sanitizer build. The corpus persists in build/fuzz/corpus;
# crashing inputs land in build/fuzz/findings.
FUZZ_SECONDS ?= 60
FUZZ_HARNESSES := queue table wire
FUZZ_STAMP := $(VENV)/.fuzz-stamp

$(FUZZ_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[dev,spark,docs,archive,archive-test,codecs,cli,fuzz]' $(EDITABLE)
	touch $@

fuzz: $(FUZZ_STAMP) asan-build
	rm -rf $(ASAN_LOGS) && mkdir -p $(ASAN_LOGS) build/fuzz/findings
	for h in $(FUZZ_HARNESSES); do \
		$(PY) tests/fuzz/fuzz_$$h.py --seeds build/fuzz/corpus/$$h && \
		$(PY) tests/fuzz/fuzz_$$h.py build/fuzz/corpus/$$h -max_total_time=$(FUZZ_SECONDS) -timeout=20 \
			-rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=build/fuzz/findings/$$h- && \
		(cd $(ASAN_TREE) && $(ASAN_ENV) $(abspath $(PY)) tests/fuzz/fuzz_$$h.py \
			--replay $(abspath build/fuzz/corpus/$$h)) || exit 1; \
	done; $(ASAN_CHECK)

bench: build
	$(PY) benchmarks/bench_wire.py
	$(PY) benchmarks/bench_queue.py
	$(PY) benchmarks/bench_wakeup.py
	$(PY) benchmarks/bench_rpc.py
	$(PY) benchmarks/bench_services.py
	$(PY) benchmarks/bench_spark.py

# chronq beside its baselines and Java Chronicle Queue (../shared/java/run.sh bench) in one run: writes
# docs/img/benchmarks.json, the PNGs beside it and the figures section of docs/benchmarks.md. It refuses
# to start on a busy machine (1-minute load average 0.5 or more); FORCE=1 measures anyway, and the page
# then says under what load.
bench-plots: build
	$(PY) benchmarks/plot.py $(if $(filter 1,$(FORCE)),--force)

# The site (mkdocs.yml: docs/*.md, README.md as the home page, the API reference from the docstrings)
# into out/site. --strict: a broken link or a docstring griffe cannot read fails the build.
docs: build
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir out/site

clean:
	rm -rf $(VENV) .nox build *.egg-info chronq/_native*.so
