# Two commands do everything on a fresh machine:
#   make demo   install into .venv, then run the demo (CPU interpreter, or the GPU when present)
#   make test   install if needed, then lint (ruff check, ruff format --check) and run the whole test suite
#               (pytest-xdist: a worker per CPU, at most 8)
#   make test-quick   the same without the tests marked `slow` (pyproject.toml registers the markers)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo lint test test-quick bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test,bench,zoo]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/python -m minicomp demo

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest -n auto --maxprocesses 8 --maxschedchunk 4

test-quick: lint
	$(BIN)/python -m pytest -n auto --maxprocesses 8 --maxschedchunk 4 -m "not slow"

bench: install
	$(BIN)/python -m minicomp bench

clean:
	rm -rf $(VENV) build *.egg-info
