# Two entry points a new user needs: `make demo` and `make test`. Both create .venv first.
#
# torch is installed before the package so that pip never resolves it on its own:
#   CPU (default):  TORCH='torch==2.13.0'   (on the project machines this is a local CPU wheel)
#   other CPU box:  make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu
#   CUDA GPU:       make setup TORCH='torch' TORCH_INDEX=https://download.pytorch.org/whl/cu126
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
# `make demo MINUTES=15` stops the demo on the clock instead of after its fixed updates
MINUTES ?=
BIN := $(VENV)/bin

.PHONY: setup demo test test-fast test-oracles lint docs bench
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install -q --disable-pip-version-check -e ".[test,export,onnx,docs]"
	touch $@

demo: setup
	$(BIN)/aiayn demo $(if $(MINUTES),--minutes $(MINUTES))

# The lint tests ran in `make lint` just before: not twice.
test: setup lint docs
	$(BIN)/python -m pytest -m "not oracle and not lint" --durations=25

# Before each commit: the suite without its end-to-end modules and slowest tests (no demo,
# no wheel build, no multi-process training), under 5 minutes on 2 cores; `make test` is the whole suite CI runs.
test-fast: setup
	$(BIN)/python -m pytest -m "not oracle and not lint and not slow" -q

# The opt-in oracles (docs/install.md): EVALB's C program, CTranslate2 agreement on a model
# trained for it, the demo model under each toolkit's own search (AIAYN_ORACLE_CHECKPOINT,
# default runs/demo/averaged; fairseq's with AIAYN_FAIRSEQ_PYTHON), the torch.compile tests. Tens of minutes on 2 CPU cores; not in `make test`.
test-oracles: setup
	$(BIN)/python -m pytest -m oracle

# The formatter, the linter (rules in pyproject.toml; `ruff format .` applies the format), the
# type checker over src/, the repository's lint tests (pytest -m lint: layout, docs, torch-free
# modules, help examples), and the longest functions and modules listed for review (warnings only).
lint: setup
	$(BIN)/ruff format --check --quiet .
	$(BIN)/ruff check --quiet .
	$(BIN)/mypy
	$(BIN)/python -m pytest -m lint
	$(BIN)/python scripts/dev/longest.py

# The documentation site (mkdocs.yml): --strict, so a broken link or anchor, or a page missing
# from the nav, fails `make test`. Written to site/ (ignored by git).
docs: setup
	$(BIN)/mkdocs build --strict --site-dir site

# The benchmark suite (benchmarks/README.md): every topic, its figures written as records into
# records/. Hours on 2 CPU cores, nothing else running; BENCH='--only train,decode' for some.
BENCH ?=
bench: setup
	$(BIN)/pip install -q --disable-pip-version-check -e ".[bench]"
	$(BIN)/python benchmarks/run_all.py $(BENCH)
