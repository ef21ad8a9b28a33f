"""The A/B gate: the working tree against a git revision, measured in one job. gate.py runs the
rounds, arms.py and worker.py are the two processes, paired.py the statistics, revision.py and
reference.py the base's code, loadguard.py the check for other processes."""
