# Every target creates .venv and installs the project into it first, so a fresh clone needs only `make`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
NATIVE := chronq/_native$(shell $(PYTHON) -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")

.PHONY: demo test test-slow lint typecheck unit bench build clean

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,spark]'
	touch $(STAMP)

$(NATIVE): chronq/_native.c $(STAMP)
	$(PY) setup.py -q build_ext --inplace

build: $(STAMP) $(NATIVE)

demo: build
	$(PY) examples/demo.py

lint: build
	$(VENV)/bin/ruff check wire chronq rpc tests examples benchmarks

typecheck: build
	$(VENV)/bin/mypy --strict wire chronq rpc

unit: build
	$(PY) -m pytest -q

test: lint typecheck unit

test-slow: build
	$(PY) -m pytest -q -m slow

bench: build
	$(PY) benchmarks/bench_wire.py
	$(PY) benchmarks/bench_queue.py

clean:
	rm -rf $(VENV) build *.egg-info chronq/_native*.so
