"""Accuracy: assisted output equals plain output (equivalence: exact or a near-tie), assisted
sampling keeps the target's distribution (sampling), HumanEval generate / evaluate / compare
(humaneval) and the stored pass@1 baselines (baselines). May import: harness.core, machine, workload, measure, sandbox.
"""
