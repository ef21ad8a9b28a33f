# Set-up, benchmark and test targets. `make bench` and `make test` work on a fresh clone.
PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
# The CPU build of torch that lies on this machine kind's disk; installed before the project so
# that pip never resolves torch to a multi-GB CUDA build.
TORCH_SPEC  ?= torch==2.13.0
# Where that torch comes from where it is not on disk: e.g. https://download.pytorch.org/whl/cpu
# (the CPU wheels; PyPI's default build of torch carries CUDA). Empty: pip's own index.
TORCH_INDEX ?=
# pip's errors only: a host's pip configuration can add a warning per package (a find-links folder
# that does not exist here); PIP_QUIET=--quiet shows pip's warnings again.
PIP_QUIET ?= -qq
# pip would compile every installed module to bytecode, torch's thousands, most of which no run imports
# (about half of a fresh set-up's time: docs/ci.md); without it a module compiles on its first import
# and its bytecode is kept from then on.
PIP_INSTALL = $(PY) -m pip install $(PIP_QUIET) --no-compile
# A folder for JUnit XML, one file per pytest stage of make test (docs/ci.md). Empty: none.
JUNIT_DIR   ?=
# The run history (harness/history/store.py): bench, both gates and baseline updates append every run's
# measurements; a file, or a postgresql:// URL (docs/history.md).
HISTORY     ?= results/history.sqlite
junit = $(if $(JUNIT_DIR),--junitxml=$(JUNIT_DIR)/$(1).xml)
# The slowest tests of each stage of make test, printed at its end: where CI's minutes go.
DURATIONS   ?= --durations=40
# The tests start hundreds of Python processes: with bytecode caching off (PYTHONDONTWRITEBYTECODE, set on
# some hosts) each one compiles the harness again and pytest rewrites every test module it collects
# again (a test module that runs pytest in child processes took 12% longer so).
unexport PYTHONDONTWRITEBYTECODE
# Parallel test workers (pytest-xdist), one per core this process may use, each pinned to its own
# core (tests/pinning.py); the tests marked `alone` (live gates, timings, the load guard) run after,
# with the machine to themselves. TEST_WORKERS=0 runs everything in this process, one after another.
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 1)
PAIR        ?= qwen-coder-1.5b+0.5b
SMOKE_PAIR  ?= smollm2-135m+self
BENCH_ARGS  ?=
K_SWEEP     ?= 2-8

.PHONY: setup bench doctor bench-smoke sweep test unit fetch perf perf-ab perf-all perf-update gate-power gate-power-ab gate-power-ab-noisy gate-power-table noisy-host clean-venv \
        accuracy accuracy-all humaneval-full sandbox-tools postgres-tools history-report sandbox-selftest quant-table

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	$(PIP_INSTALL) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	$(PIP_INSTALL) -e '.[dev]'
	touch $@

fetch: setup
	$(PY) -m harness models fetch --pair $(PAIR)

# The default benchmark: plain and assisted decoding interleaved per prompt, with the speedup.
bench: fetch
	$(PY) -m harness bench --pair $(PAIR) --compare --json results/bench.json --markdown results/bench.md \
	    --history $(HISTORY) $(BENCH_ARGS)

# This machine: CPU class and why, kernel costs at M = 1..8 tokens, the pair's predicted speedup (< 1 min).
doctor: fetch
	$(PY) -m harness doctor --pair $(PAIR) $(DOCTOR_ARGS)

# A real model that loads in seconds: SmolLM2-135M with itself in int8 (w8af32-tensor) as the draft.
bench-smoke: setup
	$(PY) -m harness models fetch --pair $(SMOKE_PAIR)
	$(PY) -m harness bench --pair $(SMOKE_PAIR) --compare $(BENCH_ARGS)

# The K sweep of the default pair (num_assistant_tokens 2..8), plain runs shared across K.
sweep: fetch
	$(PY) -m harness bench --pair $(PAIR) --compare --num-assistant-tokens $(K_SWEEP) \
	    --json results/sweep.json --markdown results/sweep.md $(BENCH_ARGS)

# The stored-baseline gate (a slower machine, driver or library) on the fast combinations and the
# default pair (greedy), against baselines/<this platform>.json; A/B against the reference where
# this platform has no baseline for a combination.
perf: fetch
	$(PY) -m harness models fetch smollm2-135m-instruct
	$(PY) -m pytest tests/perf -m "perf and not slow" --perf-history $(HISTORY) --benchmark-disable $(PERF_ARGS)

# Every combination of the matrix, the default pair included (tens of minutes).
perf-all: fetch
	$(PY) -m pytest tests/perf -m perf --perf-history $(HISTORY) --benchmark-disable $(PERF_ARGS)

# After a hardware or library change: measure this machine again, then review the diff of baselines/.
perf-update: fetch
	$(PY) -m pytest tests/perf -m "perf and not slow" --perf-update-baselines --perf-history $(HISTORY) \
	    --benchmark-disable $(PERF_ARGS)

# How well the gate tells planted slowdowns from noise (detection / false-alarm table).
gate-power: setup
	$(PY) benchmarks/gate_power.py $(GATE_POWER_ARGS)

# How well the A/B gate tells a slower commit from noise on the default pair (docs/gate-power.md, "Gate
# power"): first the tests that time the planted slowdowns live (marker `planted`), then real gates
# per planted slowdown (A/A, a 10% slower target, a 20% slower draft, and the phase levels: a 10%
# slower draft, a 10% slower verification pass, and 5 ms of host work before each verification: the
# fraction of the pass that plants 5 ms on this CPU, sized from its gates in AB_POWER_OUT, after the
# first A/A gate where it has none); then 5% at --perf-tolerance 0.05), levels interleaved, kept in
# AB_POWER_OUT and resumed from it (hours on 2 cores), with the rates of gates replayed on its A/A
# rounds resampled. Under the noisy neighbour: make gate-power-ab-noisy.
AB_POWER_OUT    ?= results/ab_power.jsonl
AB_POWER_ARGS   ?= --pair $(PAIR) --gates 20 --out $(AB_POWER_OUT)
AB_POWER_LEVELS ?= 0,0.10,draft:0.20,draft:0.10,verify:0.10,glue:5ms
gate-power-ab: fetch
	$(PY) -m pytest tests/unit -m planted -q -p no:cacheprovider
	$(PY) benchmarks/ab_power.py $(AB_POWER_ARGS) --levels $(AB_POWER_LEVELS)
	$(PY) benchmarks/ab_power.py $(AB_POWER_ARGS) --levels 0,0.05 --tolerance 0.05

# docs/gate-power.md's gate-power table made again from every kept gate (benchmarks/data/ab_power_*.jsonl),
# resampling the A/A rows whose rounds changed (minutes); a unit test checks the doc holds it.
gate-power-table: setup
	$(PY) benchmarks/gate_power_table.py --resample --write

# A reproducible noisy neighbour (benchmarks/noisy_host.py): bursts of CPU and memory-bandwidth load
# on every core, for CMD if given (e.g. make noisy-host CMD="make perf-ab"), else until Ctrl-C.
NOISY_ARGS  ?= --duty 0.3 --burst-ms 200
noisy-host: setup
	$(PY) benchmarks/noisy_host.py $(NOISY_ARGS) $(if $(CMD),-- $(CMD))

gate-power-ab-noisy: fetch
	$(PY) benchmarks/noisy_host.py $(NOISY_ARGS) -- $(MAKE) gate-power-ab

# What each precision buys (quant/): quantize time, decode tokens/s, held-out perplexity per
# precision of the pair's target and draft, then assisted speedups per target+draft precision.
# Quantized checkpoints are cached (~/.cache/assisted-bench/quantized): the first run quantizes.
quant-table: fetch
	$(PY) benchmarks/quant_table.py --pair $(PAIR) --json results/quant_table.json $(QUANT_ARGS)

# The unit tests (tiny random models) and the real-model smoke tests: in parallel, then the `alone` ones.
unit: setup postgres-tools
	$(PY) -m pytest tests/unit tests/integration -m "not alone and not planted" -n $(TEST_WORKERS) --dist loadfile \
	    $(DURATIONS) $(call junit,unit)
	$(PY) -m pytest tests/unit tests/integration -m "alone and not planted" $(DURATIONS) $(call junit,unit-alone)

# The test suite CI runs: the unit and integration tests, the accuracy suite's CI part (greedy
# equivalence on SmolLM2, HumanEval pass@1 of the default pair on a fixed subset, in the sandbox), and
# the merge gate: the A/B perf gate of this tree against the reference commit
# (baselines/reference.json) on the default pair, greedy.
test: unit
	$(MAKE) accuracy
	$(MAKE) perf-ab
	$(MAKE) history-report

# The run history as one static HTML page for CI to publish (trends, change points, latest verdicts;
# docs/history.md), and the change points in it.
history-report: setup
	$(PY) -m harness history report --history $(HISTORY) --out results/history.html

# The merge gate (in make test): the working tree against a revision (default: the reference commit)
# in one job, the arms side by side on their own cores where 2 are allowed (--perf-duet auto), on the
# default pair's greedy combinations. The SmolLM2 pairs are left out by default: in bf16 their rounds
# spread 3-4x the default pair's on a noisy host, so they decide late or not at all (docs/perf-gate.md,
# "Which combinations the merge gate runs"); add them with AB_PAIRS. E.g. make perf-ab AGAINST=HEAD~1
# AB_MAX_ROUNDS caps the rounds at 16 (the registry's cap is 32) so that make test stays within 30
# minutes on a noisy host: on a quiet AMD VM nearly every measured gate decided by 16 rounds; under
# noise more gates end UNDECIDED, a warning (docs/gate-studies.md, "The merge gate's cap").
AGAINST       ?= reference
AB_PAIRS      ?= $(PAIR)
AB_MAX_ROUNDS ?= 16
perf-ab: setup
	$(foreach p,$(AB_PAIRS),$(PY) -m harness models fetch --pair $(p) &&) true
	$(PY) -m pytest tests/perf -m "perf and not slow" $(foreach p,$(AB_PAIRS),--perf-pair $(p)) --perf-against $(AGAINST) \
	    --perf-max-repeats $(AB_MAX_ROUNDS) --perf-history $(HISTORY) --benchmark-disable $(call junit,perf-ab) \
	    $(PERF_ARGS)

# Accuracy (tests/accuracy): greedy equivalence with near-tie triage, lossless sampling, HumanEval
# pass@1 of the default pair on a fixed subset in the sandbox. CI-sized: a few minutes on 2 cores.
HE_OUT      ?= results/humaneval
accuracy: fetch
	$(PY) -m harness models fetch smollm2-135m-instruct
	$(PY) -m pytest tests/accuracy -m "accuracy and not slow" -rA -n $(TEST_WORKERS) --dist load $(DURATIONS) \
	    $(call junit,accuracy)

# Every accuracy combination, the 1.5B pair's and the full HumanEval included (hours on a CPU).
accuracy-all: fetch
	$(PY) -m harness models fetch smollm2-135m-instruct
	$(PY) -m pytest tests/accuracy -m accuracy -rA -s

# All 164 HumanEval problems, plain and assisted, greedy (hours on a CPU). Plain and assisted grow
# together in steps of tasks, so an interrupted run still leaves a paired comparison on its first N
# tasks; rerun to resume (finished tasks are kept, a torn last line is dropped).
HE_STEPS    ?= 16 32 48 64 80 96 112 128 146 164
humaneval-full: fetch
	@for n in $(HE_STEPS); do \
	  $(PY) -m harness humaneval generate --pair $(PAIR) --plain --limit $$n --out $(HE_OUT)/plain.jsonl || exit 1; \
	  $(PY) -m harness humaneval generate --pair $(PAIR) --assisted-generation --limit $$n \
	      --out $(HE_OUT)/assisted.jsonl || exit 1; \
	done
	$(PY) -m harness humaneval evaluate $(HE_OUT)/plain.jsonl --allow-code-execution
	$(PY) -m harness humaneval evaluate $(HE_OUT)/assisted.jsonl --allow-code-execution
	$(PY) -m harness humaneval compare $(HE_OUT)/plain.jsonl $(HE_OUT)/assisted.jsonl --triage \
	    --json $(HE_OUT)/compare.json

# bubblewrap: the sandbox's backend for a user who is not root (as root, the unshare backend needs
# nothing installed). Without either, model-written code is refused (docs/sandbox.md). Ubuntu 24.04 keeps
# unprivileged user namespaces from bwrap unless kernel.apparmor_restrict_unprivileged_userns=0 (docs/ci.md).
# PostgreSQL's server for the run history's tests (tests/unit/pgserver.py starts a throw-away one as an
# unprivileged user): Debian's postgresql package, installed where it is missing.
postgres-tools:
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 && echo "PostgreSQL server already installed" || \
	  { if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq postgresql; \
	    elif command -v sudo >/dev/null; then sudo apt-get update -qq && sudo apt-get install -y -qq postgresql; \
	    else echo "install the Debian package postgresql (needs root)"; exit 1; fi; }

sandbox-tools:
	@command -v bwrap >/dev/null && echo "bwrap already installed" || \
	  { if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq bubblewrap; \
	    elif command -v sudo >/dev/null; then sudo apt-get update -qq && sudo apt-get install -y -qq bubblewrap; \
	    else echo "install the Debian package bubblewrap (needs root)"; exit 1; fi; }

# The hostile completions on this machine's backend, and the 164 canonical solutions.
sandbox-selftest: setup
	$(PY) -m harness sandbox selftest --allow-code-execution

clean-venv:
	rm -rf $(VENV)
