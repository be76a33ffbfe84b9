# The README's two commands: `make train` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ROOT_DIR ?= runs/categorical_dqn_pong
CONFIG ?= categorical_dqn.gin
SECONDS ?= 10

.PHONY: train test test-all lint bench venv clean

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,tf_agents,video]'
	touch $(STAMP)

# The default training run: Categorical DQN on Pong, 10M frames. Ctrl-C saves a checkpoint;
# `make train` again resumes. Other configs: make train CONFIG=ppo.gin ROOT_DIR=runs/ppo_pong
train: $(STAMP)
	$(PY) bin/train --gin_file=$(CONFIG) --root_dir=$(ROOT_DIR)

lint: $(STAMP)
	$(VENV)/bin/ruff check tfaccel bin tests benchmarks
	$(VENV)/bin/ruff format --check tfaccel bin tests benchmarks

# The fast tier (unit tests and one smoke run per family, a few minutes) in TEST_WORKERS
# processes (pytest-xdist), then the few marked serial alone. tests/conftest.py says which.
TEST_WORKERS ?= 2
test: $(STAMP) lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not slow and not serial and not full"
	$(PY) -m pytest -q -m "serial and not slow and not full"

# Everything (what CI runs): the integration tests, the docs' examples, the notebooks and the
# wheel's quick start in a clean virtual environment too.
test-all: $(STAMP) lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not slow and not serial"
	$(PY) -m pytest -q -m "serial and not slow"

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) bin/bench_sampler --game=pong --seconds=$(SECONDS) \
	    --layouts=1x8,2x4,2x8,2x16,2x32,4x8,4x16 --inference_layouts=2x32,2x64,4x16,4x32,4x64 \
	    --json=benchmarks/results/speed/bench_sampler__pong.json \
	    --plot=benchmarks/results/speed/bench_sampler__pong.png

clean:
	rm -rf $(VENV) build *.egg-info
