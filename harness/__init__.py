"""assisted-bench: performance and accuracy regression suite for LLM assisted generation.

Five rooms, imports flowing one way (tests/unit/test_layout.py holds the rule):

    core/      the measurement: registry, models, prompts, decode settings, one generation,
               the bench run and its tables. Imports no other room.
    perf/      the perf gate: combinations, rounds, statistics, baselines, reports, the pytest plugin.
               Imports core.
    sandbox/   running untrusted code: backends, the child process, hostile self-test cases.
               Imports core.
    accuracy/  greedy equivalence, lossless sampling, HumanEval. Imports core and sandbox.
    cli/       `python -m harness ...`: one module per command group. Imports any room.

Data lives beside the code: matrix.toml (the registry), schemas/, data/.
"""

__version__ = "0.1.0"
