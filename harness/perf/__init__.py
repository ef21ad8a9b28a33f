"""The perf gate (`pytest -m perf`), two gates in two rooms beside what they share:

    plugin.py        pytest options, hooks and the fixture; gates.py runs a combination through a gate
    combinations.py  what to measure (the matrix's [perf] table); runner.py measures it round by round
    record.py        one round and one combination's result, as every module and results.json hold them
    outcome.py       the one verdict vocabulary of both gates
    report.py        the terminal summary, results.json, summary.md and the charts
    ab/              the A/B gate: this tree against a revision, in worker processes, paired rounds
    stored/          the stored-baseline gate: this machine against its baselines/ file

ab/ and stored/ never import each other. May import: harness.core, machine, workload, measure, history.
"""
