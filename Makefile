# The README's two commands: `make train` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ROOT_DIR ?= runs/default
SECONDS ?= 10

.PHONY: train test lint bench venv clean

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,tf_agents]'
	touch $(STAMP)

# Until the training loop lands (issue 3), the default "training" is a short demo of the pool.
train: $(STAMP)
	$(PY) bin/pool_demo --game=pong --seconds=$(SECONDS)

lint: $(STAMP)
	$(VENV)/bin/ruff check tfaccel bin tests benchmarks
	$(VENV)/bin/ruff format --check tfaccel bin tests benchmarks

test: $(STAMP) lint
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) bin/bench_sampler --game=pong --seconds=$(SECONDS) \
	    --json=benchmarks/results/sampler_pong.json --plot=benchmarks/results/sampler_pong.png

clean:
	rm -rf $(VENV) build *.egg-info
