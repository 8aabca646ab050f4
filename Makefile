# Two entry points: `make demo` and `make test`. Both build .venv from scratch when needed.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Test files run on this many processes, each file on one (tests/conftest.py); the Ray tests
# and those marked realtime (held to timing bounds) run afterwards, one at a time.
TEST_WORKERS ?= 2

.PHONY: demo test lint bench clean venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "torch==2.13.0" numpy
	$(BIN)/pip install --quiet -e ".[dev]" "torch==2.13.0"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m shoal.demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --durations=15 \
		-m "not realtime and not ray"
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=10 -m "realtime or ray"

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info
