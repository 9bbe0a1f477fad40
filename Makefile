# Two commands do everything on a fresh machine:
#   make demo   install into .venv, then run the demo (CPU interpreter, or the GPU when present)
#   make test   install if needed, then run the test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test,bench]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/python -m minicomp demo

test: install
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python -m minicomp bench

clean:
	rm -rf $(VENV) build *.egg-info
