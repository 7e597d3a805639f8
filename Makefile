# Two commands do all the set-up on a fresh machine:
#   make demo   -- create .venv, install, run the main job on the bundled digits
#   make test   -- create .venv, install, lint (ruff), build the docs (Sphinx, warnings as
#                  errors) and run the test suite; then, when the main venv's ArviZ is
#                  0.x, the ArviZ 1.x tests in .venv-arviz1 (ArviZ 1.x needs Python >=
#                  3.12; the main venv takes python3, whose ArviZ may be 0.x; with
#                  PYTHON=python3.12 one venv runs everything, on ArviZ 1.x only)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
OUT ?= runs/demo
# a Python >= 3.12 for the ArviZ 1.x tests (pyenv's shims of other versions do not run)
PYTHON_ARVIZ1 ?= $(shell for p in python3.12 python3.13 $$HOME/.pyenv/versions/3.12*/bin/python3 $$HOME/.pyenv/versions/3.13*/bin/python3; do $$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { echo $$p; break; }; done)
VENV_ARVIZ1 ?= .venv-arviz1
STAMP_ARVIZ1 := $(VENV_ARVIZ1)/.installed-stamp
DEPS_ARVIZ1 := $(VENV_ARVIZ1)/.dependencies-stamp
ARVIZ1_TESTS ?= tests/test_arviz_tree.py tests/test_diagnostics.py tests/test_diagnostics_budget.py tests/test_mcmc.py tests/test_readme.py tests/test_uncertainty_run.py

.PHONY: demo test test-main test-all test-arviz1 arviz1-venv arviz1-dependencies lint docs bench install

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

# the ArviZ 1.x venv in two steps: its dependencies (pyproject's, read by tomllib) while
# the main venv installs, so that the two downloads share the start; then the project itself,
# after the main venv, since both pips build the project's metadata in this folder
$(DEPS_ARVIZ1): pyproject.toml
	test -x $(VENV_ARVIZ1)/bin/python || $(PYTHON_ARVIZ1) -m venv $(VENV_ARVIZ1)
	$(VENV_ARVIZ1)/bin/python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"] + p["optional-dependencies"]["test"]))' > $(VENV_ARVIZ1)/requirements.txt
	$(VENV_ARVIZ1)/bin/python -m pip install --quiet --disable-pip-version-check -r $(VENV_ARVIZ1)/requirements.txt "arviz>=1"
	touch $(DEPS_ARVIZ1)

$(STAMP_ARVIZ1): pyproject.toml $(DEPS_ARVIZ1) $(STAMP)
	$(VENV_ARVIZ1)/bin/python -m pip install --quiet --disable-pip-version-check -e ".[test]" "arviz>=1"
	touch $(STAMP_ARVIZ1)

demo: $(STAMP)
	$(BIN)/twodg-pyro run --out $(OUT) --overwrite

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# the guides and the API reference (docs/), warnings as errors: build/docs/index.html
docs: $(STAMP)
	$(BIN)/python -m sphinx -E -W --keep-going -q -b html docs build/docs

# the suite runs on every core (pytest-xdist, one torch thread per worker: tests/conftest.py);
# the ArviZ 1.x venv, when one is needed, installs its dependencies (mostly a download and
# unpacking, one core) beside the main venv's install, not beside the suite, which keeps
# both cores busy; its tests run after the main ones
test:
	$(MAKE) --no-print-directory -j2 --output-sync=target install arviz1-dependencies
	$(MAKE) --no-print-directory -j2 --output-sync=target test-main arviz1-venv
	$(MAKE) --no-print-directory test-arviz1

test-main: lint docs
	$(BIN)/python -m pytest -n auto -m "not slow" -q

# 0 when the main venv has ArviZ 1.x (its Python is >= 3.12): no second venv
MAIN_HAS_ARVIZ1 = $(BIN)/python -c 'import sys; from importlib.metadata import version; sys.exit(int(version("arviz").split(".")[0]) < 1)' 2>/dev/null

arviz1-venv: $(STAMP)
	@if ! $(MAIN_HAS_ARVIZ1) && [ -n "$(PYTHON_ARVIZ1)" ]; then $(MAKE) --no-print-directory $(STAMP_ARVIZ1); fi

# the main venv's Python (before it exists: the one that will make it); pip gives ArviZ 1.x
# to a Python >= 3.12 and 0.x to older ones, so this tells, before the main venv is
# installed, whether a second venv will be needed
MAIN_PYTHON = $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
MAIN_GETS_ARVIZ1 = $(MAIN_PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null

arviz1-dependencies:
	@if ! $(MAIN_GETS_ARVIZ1) && [ -n "$(PYTHON_ARVIZ1)" ]; then $(MAKE) --no-print-directory $(DEPS_ARVIZ1); fi

# the diagnostics' tests on ArviZ 1.x (the main venv's Python may only have 0.x); a main
# venv on Python >= 3.12 has ArviZ 1.x, and `test` has run them there: no second venv
test-arviz1: $(STAMP)
	@if $(MAIN_HAS_ARVIZ1); then \
		echo "test-arviz1: the main venv has ArviZ 1.x, its tests ran there"; \
	elif [ -z "$(PYTHON_ARVIZ1)" ]; then \
		echo "test-arviz1: no Python >= 3.12 on this machine, ArviZ 1.x tests not run"; \
	else \
		$(MAKE) --no-print-directory $(STAMP_ARVIZ1) && \
		$(VENV_ARVIZ1)/bin/python -m pytest -n auto -m "not slow" -q $(ARVIZ1_TESTS); \
	fi

test-all: lint
	$(BIN)/python -m pytest -q -m "slow or not slow"

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_svi_step.py
