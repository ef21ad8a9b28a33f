"""What one side-by-side arm's step costs with each kind of partner on the other core: the target's
one-token step (bf16, one thread, 128 cached tokens) timed in a pinned worker while the other core
is idle, busy with a spinning process, with the stand-in (harness/perf/ab/standin.py) or with a
second worker of the same model, with or without the arms exchanging cores every --swap seconds
(harness/perf/ab/duet.py Swapping). Each condition runs --steps steps, the conditions in a new
random order every cycle; prints the mean over cycles of each trial's median step, and appends one
JSON row to --out.

    python benchmarks/lone_arm.py --cycles 4 --out benchmarks/data/lone_arm_amx.jsonl

What the kept row showed: docs/gate-studies.md, "The stand-in".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

CONDITIONS = ("idle", "spin", "stand-in", "model")


def worker(core: int, target: str) -> None:
    """A child: load the target, prefill 128 tokens, then time N one-token steps per request line."""
    import torch

    from harness.workload import models, registry

    torch.set_num_threads(1)
    os.sched_setaffinity(0, {core})
    model = models.load(models.resolve_spec(registry.load_matrix(), target), "bf16").model
    with torch.inference_mode():
        out = model(input_ids=torch.randint(100, 20000, (1, 128)), use_cache=True)
        cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        print("ready", flush=True)
        for line in sys.stdin:
            times = []
            for _ in range(int(line)):
                t = time.perf_counter()
                out = model(input_ids=token, past_key_values=cache, use_cache=True)
                token = out.logits[:, -1:].argmax(-1)
                times.append(time.perf_counter() - t)
                if cache.get_seq_length() >= 160:
                    cache.crop(128 - cache.get_seq_length())
            print(json.dumps(times), flush=True)


class Bench:
    """The measured worker on one core, and the partners the other core may hold."""

    def __init__(self, target: str, steps: int, swap_s: float, near: int, far: int):
        from harness.perf.ab.standin import StandIn

        self.target, self.steps, self.swap_s, self.near, self.far = target, steps, swap_s, near, far
        self.children: list[subprocess.Popen] = []
        self.stand_in = StandIn({"OMP_NUM_THREADS": "1"})

    def child(self, cmd: list[str], **kw) -> subprocess.Popen:
        self.children.append(subprocess.Popen(cmd, **kw))
        return self.children[-1]

    def start(self) -> None:
        self.measured, self.second = self.start_worker(self.near), self.start_worker(self.far)
        if not self.stand_in.start():
            raise SystemExit("lone_arm: the stand-in did not start")
        self.sleeper = self.child(["sleep", "1000000"])

    def start_worker(self, core: int) -> subprocess.Popen:
        w = self.child([sys.executable, __file__, "--worker", str(core), "--target", self.target],
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if w.stdout.readline().strip() != "ready":
            raise SystemExit(f"lone_arm: the worker on core {core} did not start")
        return w

    def partner(self, condition: str) -> subprocess.Popen:
        """The other core's process for `condition`, started working."""
        if condition.startswith("spin"):
            return self.child([sys.executable, "-c", "while True: pass"])
        if condition.startswith("stand-in"):
            self.stand_in.cover(self.sleeper.pid, self.far)  # as if the sleeper were an arm that had finished
            return self.stand_in.process
        if condition.startswith("model"):
            self.second.stdin.write(f"{self.steps * 3}\n")  # outlasts the measured steps
            self.second.stdin.flush()
            return self.second
        return self.sleeper

    def trial(self, condition: str) -> float:
        """The median step (ms) of one trial of `condition`."""
        from harness.perf.ab.duet import Swapping, pin

        pin(self.measured.pid, self.near)
        partner = self.partner(condition)
        pin(partner.pid, self.far)
        time.sleep(0.3)
        self.measured.stdin.write(f"{self.steps}\n")
        self.measured.stdin.flush()
        swapping = (Swapping((self.measured.pid, partner.pid), (self.near, self.far), self.swap_s)
                    if condition.endswith("exchanging") else contextlib.nullcontext())
        with swapping:
            times = json.loads(self.measured.stdout.readline())
        if condition.startswith("spin"):
            partner.kill()
            partner.wait()
            self.children.remove(partner)
        self.stand_in.rest()
        if partner is self.second:
            self.second.stdout.readline()
        return 1000 * statistics.median(times)

    def close(self) -> None:
        self.stand_in.close()
        for c in self.children:
            c.kill()
            c.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--steps", type=int, default=16, help="steps per trial (default 16)")
    p.add_argument("--cycles", type=int, default=4, help="trials of each condition (default 4)")
    p.add_argument("--swap", type=float, default=0.05, metavar="SECONDS", help="the exchanges' period (default 0.05)")
    p.add_argument("--out", type=Path, help="JSON lines: one row a run, appended")
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is not None:
        worker(args.worker, args.target)
        return 0
    if args.steps < 4 or args.cycles < 1 or args.swap < 0.05:
        p.error("--steps at least 4, --cycles at least 1, --swap at least 0.05")
    from harness.machine import affinity
    from harness.machine.capability import detect

    cores = affinity.allowed_cores()
    if len(cores) < 2:
        p.error(f"needs 2 cores; this process may use {cores}")
    bench = Bench(args.target, args.steps, args.swap, *cores[:2])
    medians: dict[str, list[float]] = {}
    conditions = [c + s for c in CONDITIONS for s in ("", ", exchanging")]
    try:
        bench.start()
        bench.trial("idle")  # a warm-up: a fresh worker's first steps run slower
        for cycle in range(args.cycles):
            random.shuffle(conditions)
            for c in conditions:
                medians.setdefault(c, []).append(bench.trial(c))
                print(f"cycle {cycle + 1}/{args.cycles} {c:22} median step {medians[c][-1]:.1f} ms", flush=True)
    finally:
        bench.close()
    print(f"{args.target}, bf16, one thread, {detect().name}; mean over {args.cycles} trials of the median step:")
    for c in sorted(medians):
        print(f"  {c:22} {statistics.fmean(medians[c]):7.1f} ms  ({', '.join(f'{m:.0f}' for m in medians[c])})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"target": args.target, "cpu_class": detect().name, "steps": args.steps,
                                 "swap_s": args.swap, "median_step_ms": medians}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
