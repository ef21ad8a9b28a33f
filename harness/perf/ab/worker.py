"""One arm of the A/B gate: a long-lived process that measures perf rounds with its own tree's code.

    python -m harness.perf.ab.worker        (started by harness/perf/ab/arms.py, never by hand)

The A/B gate runs one worker per arm: the candidate from the working tree, the base from a git
worktree of the revision under test. Each imports its own `harness`, so each measures its own
code; both load the same models (the model cache is shared) and run the same prompts and settings,
which the controller sends. The protocol is JSON lines: one request on stdin, one answer on
stdout; logs go to stderr. A request is {"op": ..., ...}; every answer has "ok" and, when false, a
one-line "error".

    hello                               -> protocol version, features, this tree's harness folder, pid
    load  combination, settings, matrix, plant?  -> prompt ids; models loaded, warmed up
    round index, sync?                  -> one round: plain / assisted tokens/s, speedup, counters
    quit                                -> exits 0

With "sync": true (feature "runs-together"), between two runs of the round (a prompt in one mode) the
worker answers {"ok": true, "between": k, "of": n} after its k-th of n runs and waits for {"op": "go"} before the
next: side by side, the controller starts each run of both arms together (docs/perf-gate.md, "The
arms in step within a round"). A worker without the feature runs its round through.

A revision whose tree has no such module predates the A/B gate and cannot be a base.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

PROTOCOL = 1
SYNC = "runs-together"  # a round whose runs start when the controller says go, told how many there are (below)
FEATURES = (SYNC,)  # what this worker can do beyond the protocol's requests (a base may predate them)

log = logging.getLogger("harness.perf.ab.worker")


class Worker:
    """The state of one arm: its registry, its loaded pair and its round runner."""

    def __init__(self, stdin: Any = None, stdout: Any = None) -> None:
        self.runner: Any = None
        self.stdin, self.stdout = stdin, stdout  # a synchronised round talks to the controller between its runs

    def hello(self, request: dict[str, Any]) -> dict[str, Any]:
        import harness

        return {"protocol": PROTOCOL, "features": list(FEATURES), "harness": os.path.dirname(harness.__file__),
                "pid": os.getpid()}

    def load(self, request: dict[str, Any]) -> dict[str, Any]:
        from harness.workload import registry
        from harness.perf.combinations import Combination, PerfSettings
        from harness.perf.runner import Runner, load_pair

        matrix = registry.load_matrix(request.get("matrix"), user=request.get("user_registry"))
        settings = PerfSettings(**request["settings"])
        combo = Combination.from_request(matrix, request["combination"], settings)
        plant = request.get("plant") or {}
        start = time.perf_counter()
        loaded = load_pair(combo, slowdown=plant.get("fraction", 0.0), plant_into=plant.get("into", "target"))
        self.runner = Runner(combo, loaded, settings)
        self.runner.warmup()
        return {"prompt_ids": [p.id for p in self.runner.prompts], "load_s": time.perf_counter() - start}

    def round(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.runner is None:
            raise RuntimeError("round before load")
        between = self.wait_for_go if request.get("sync") else None
        return self.runner.round(between).to_json()  # a harness.perf.record.Round

    def wait_for_go(self, runs: int, of: int) -> None:
        """Say that `runs` of the round's `of` runs are done, and wait until the controller says go."""
        print(json.dumps({"ok": True, "between": runs, "of": of}), file=self.stdout, flush=True)
        line = self.stdin.readline()
        if not line:
            raise EOFError("the controller went away in the middle of a round")
        if json.loads(line).get("op") != "go":
            raise ValueError(f"expected go between the runs of a round, got {line.strip()[:120]!r}")


def serve(stdin: Any = sys.stdin, stdout: Any = sys.stdout) -> int:
    """Answer requests until quit or end of input. A failed request answers ok: false with the
    error on one line, and the worker goes on: the controller decides whether that ends the gate."""
    worker = Worker(stdin, stdout)
    for line in iter(stdin.readline, ""):
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            op = request["op"]
            if op == "quit":
                print(json.dumps({"ok": True}), file=stdout, flush=True)
                return 0
            if op not in ("hello", "load", "round"):
                raise ValueError(f"unknown op {op!r}")
            answer = {"ok": True, **getattr(worker, op)(request)}
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the controller as one line
            log.exception("request failed")
            answer = {"ok": False, "error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}
        print(json.dumps(answer, allow_nan=False), file=stdout, flush=True)
    return 0


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers

    transformers.logging.set_verbosity_error()
    # The answers get a descriptor of their own; fd 1 (print, a library's stray output) joins the log.
    answers = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    return serve(stdout=answers)


if __name__ == "__main__":
    sys.exit(main())
