# Every target creates .venv and installs the project into it first, so a fresh clone needs only `make`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test test-slow test-pure test-interop lint typecheck unit bench bench-plots docs build clean

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,spark,docs]'
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

unit: build
	$(PY) -m pytest -q

test: lint typecheck unit

# pytest exits 5 when nothing is marked slow; that is not a failure.
test-slow: build
	$(PY) -m pytest -q -m slow || [ $$? -eq 5 ]

# Real Java Chronicle Queue 5.26 reads, resumes, method-reads and appends to queues chronq wrote
# (../shared/java/run.sh, needs a JDK 17). run.sh installs the Debian jars Chronicle needs on first use
# when it runs as root (apt-get); otherwise the tests skip, naming the packages (fail under CHRONQ_STRICT=1).
test-interop: build
	$(PY) -m pytest -q -m interop

# The wire and rpc suites again on the pure-Python reference codec (what runs where the C
# accelerator cannot be built); the differential tests then compare it with nothing but itself.
test-pure: build
	WIRE_NO_SPEEDUPS=1 $(PY) -m pytest -q tests/test_wire_binary.py tests/test_wire_typed.py \
		tests/test_wire_text.py tests/test_wire_history.py tests/test_wire_wiretypes.py tests/test_wire_fuzz.py tests/test_wire_bounds.py tests/test_wire_fields.py \
		tests/test_rpc_reader.py tests/test_rpc_writer.py tests/test_rpc_history.py tests/test_rpc_java_queues.py \
		tests/test_rpc_service.py tests/test_rpc_wires.py tests/test_rpc_fuzz.py tests/test_rpc_dispatch_scope.py \
		tests/test_wire_fieldless.py tests/test_wire_record.py

bench: build
	$(PY) benchmarks/bench_wire.py
	$(PY) benchmarks/bench_queue.py
	$(PY) benchmarks/bench_rpc.py
	$(PY) benchmarks/bench_spark.py

# chronq beside its baselines and Java Chronicle Queue (../shared/java/run.sh bench) in one run: writes
# docs/img/benchmarks.json, the PNGs beside it and the figures section of docs/benchmarks.md.
bench-plots: build
	$(PY) benchmarks/plot.py

# The site (mkdocs.yml: docs/*.md, README.md as the home page, the API reference from the docstrings)
# into out/site. --strict: a broken link or a docstring griffe cannot read fails the build.
docs: build
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir out/site

clean:
	rm -rf $(VENV) build *.egg-info chronq/_native*.so
