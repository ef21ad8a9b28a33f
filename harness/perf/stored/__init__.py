"""The stored-baseline gate: this machine's rounds against baselines/<platform>.json. baselines.py
reads and writes the files, host.py checks the host and software against them, stats.py and
verdict.py decide."""
