"""How it is measured: one generate call, the interleave, a bench run, its record and report.

generate (one measured `generate` call), interleave (ABBA order and warm-up), record (the result
record and the table's columns), bench (a benchmark run of a selection) and report (tables and
the results JSON). May import: core, machine, workload.
"""
