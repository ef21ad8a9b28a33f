import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def pytest_collection_modifyitems(items):
    """The 1.5B pair's tests first (minutes each; the SmolLM2 rows take seconds to a minute): xdist's
    `--dist load` hands tests out in this order, so the short ones fill the workers' ends."""
    items.sort(key=lambda item: "qwen-coder-1.5b" not in item.nodeid and "humaneval" not in item.nodeid)
