"""What a Python environment imports, printed as JSON: run as a file by the interpreter probed
(`python -I probe_environment.py`, harness/perf/ab/environment.py), so it needs the standard
library only; an environment in which a worker cannot import torch or transformers fails here."""

from __future__ import annotations

import importlib.metadata  # binds importlib too
import json
import re
import sys


def installed() -> dict[str, str]:
    """The distributions this interpreter imports, name -> version (the first on sys.path wins, as
    an import would: an overlay's own copy before the one it shadows), python's own version included."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = re.sub(r"[-_.]+", "-", (dist.metadata["Name"] or "")).lower()
        if name and name not in found:
            found[name] = dist.version
    return {"python": sys.version.split()[0], **found}


if __name__ == "__main__":
    for module in ("torch", "transformers"):  # what a worker imports first: an environment without them fails here
        importlib.import_module(module)
    print(json.dumps(installed()))
