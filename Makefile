# The two commands a fresh machine needs: `make demo` and `make test`.
# Both create .venv and install neffcache into it first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

# The import contracts in pyproject.toml, read from .typing/: the package as installed (cli/ is
# neffcache.cli, ...), which lint-imports finds only there. No cache: it would land in .typing/.
LINT_IMPORTS := cd .typing && ../$(BIN)/lint-imports --no-logo --no-cache --config ../pyproject.toml

# The editable install's one setuptools note ("Editable installation": imports come from this
# checkout) is what this Makefile wants, so it is not printed; nothing else is filtered.
$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install --quiet -e '.[s3,server,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/neffcache demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(LINT_IMPORTS)
	$(BIN)/pytest -n 2 -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(LINT_IMPORTS)

bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV)
