# Set-up, benchmark and test targets. `make bench` and `make test` work on a fresh clone.
PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
# The CPU build of torch that lies on this machine kind's disk; installed before the project so
# that pip never resolves torch to a multi-GB CUDA build.
TORCH_SPEC  ?= torch==2.13.0
PAIR        ?= qwen-coder-1.5b+0.5b
SMOKE_PAIR  ?= smollm2-135m+self
BENCH_ARGS  ?=
K_SWEEP     ?= 2-8

.PHONY: setup bench bench-smoke sweep test unit fetch perf perf-all perf-update gate-power clean-venv

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install "$(TORCH_SPEC)"
	$(PY) -m pip install -e '.[dev]'
	touch $@

fetch: setup
	$(PY) -m harness models fetch --pair $(PAIR)

# The default benchmark: plain and assisted decoding interleaved per prompt, with the speedup.
bench: fetch
	$(PY) -m harness bench --pair $(PAIR) --compare --json results/bench.json --markdown results/bench.md $(BENCH_ARGS)

# A real model that loads in seconds: SmolLM2-135M with itself in w8af32 as the draft.
bench-smoke: setup
	$(PY) -m harness models fetch --pair $(SMOKE_PAIR)
	$(PY) -m harness bench --pair $(SMOKE_PAIR) --compare $(BENCH_ARGS)

# The K sweep of the default pair (num_assistant_tokens 2..8), plain runs shared across K.
sweep: fetch
	$(PY) -m harness bench --pair $(PAIR) --compare --num-assistant-tokens $(K_SWEEP) \
	    --json results/sweep.json --markdown results/sweep.md $(BENCH_ARGS)

# The perf gate on the fast combinations (SmolLM2), against baselines/<this platform>.json.
perf: setup
	$(PY) -m harness models fetch smollm2-135m-instruct
	$(PY) -m pytest tests/perf -m "perf and not slow" --benchmark-disable $(PERF_ARGS)

# Every combination of the matrix, the default pair included (tens of minutes).
perf-all: fetch
	$(PY) -m pytest tests/perf -m perf --benchmark-disable $(PERF_ARGS)

# After a hardware or library change: measure this machine again, then review the diff of baselines/.
perf-update: setup
	$(PY) -m pytest tests/perf -m "perf and not slow" --update-baselines --benchmark-disable $(PERF_ARGS)

# How well the gate tells planted slowdowns from noise (detection / false-alarm table).
gate-power: setup
	$(PY) benchmarks/gate_power.py $(GATE_POWER_ARGS)

unit: setup
	$(PY) -m pytest tests/unit -q

# The test suite CI runs: unit tests (tiny random models), the real-model smoke tests, and the perf
# gate on the fast combinations (a machine kind without committed baselines skips them, saying so).
test: setup
	$(PY) -m pytest tests/unit tests/integration
	$(MAKE) perf PERF_ARGS="--perf-missing-baseline skip $(PERF_ARGS)"

clean-venv:
	rm -rf $(VENV)
