"""Where a planted slowdown's own work lands (harness/perf/plant.py): a pass of a few milliseconds
(one thread, matrix products) is timed by the pass timer as a run times it (harness/measure/phases.py
PassTimer, attached after the plant, as a run attaches it), with no plant and with plants of 0, 10
and 20%. Per setup, the median over the calls of the time outside the timed pass (the timer's own
hooks, and whatever of the plant ran outside: it becomes host overhead in a real run), and of a
fixed piece of host work right after each pass (argmax over a vocabulary's logits, small tensors,
a dict), which shows whether what follows a spin runs colder. The setups take turns, `--turns`
times, so that each meets the same moments of the host. Figures: docs/perf-gate.md, "A planted
slowdown stays in its phase".

    python benchmarks/plant_placement.py --turns 4 --calls 300
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from harness.measure.phases import PassTimer
from harness.perf.plant import PlantedSlowdown

SETUPS = (("no plant", None), ("plant 0%", 0.0), ("plant 10%", 0.1), ("plant 20%", 0.2))
VOCAB = 151936  # Qwen2.5's: the logits the host work reads after a pass


class Pass(torch.nn.Module):
    """A forward pass of a few milliseconds on one thread."""

    def __init__(self, width: int = 2048, depth: int = 6):
        super().__init__()
        self.w, self.depth = torch.randn(width, width), depth

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.depth):
            x = x @ self.w
        return x


def host_work(logits: torch.Tensor) -> float:
    """Seconds of a fixed piece of host work, as an assisted step does between passes."""
    t0 = time.perf_counter()
    for _ in range(5):
        int(logits.argmax())
        torch.cat([torch.arange(300), torch.arange(16)])
        {i: i for i in range(200)}
    return time.perf_counter() - t0


def measure(fraction: float | None, calls: int, logits: torch.Tensor) -> tuple[float, float]:
    """Median microseconds outside the timed pass, and of the host work after it."""
    model = Pass()
    if fraction is not None:
        PlantedSlowdown(model, fraction)
    timer = PassTimer(clock=time.perf_counter, cpu_clock=time.thread_time)
    timer.attach(model, "draft")
    x = torch.randn(1, model.w.shape[0])
    outside, after = [], []
    for _ in range(calls):
        t0 = time.perf_counter()
        model(x)
        outside.append(time.perf_counter() - t0 - timer.calls[-1].seconds)
        after.append(host_work(logits))
    return statistics.median(outside) * 1e6, statistics.median(after) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=4, help="times each setup runs, in turn with the others")
    ap.add_argument("--calls", type=int, default=300, help="passes a setup times in a turn")
    args = ap.parse_args()
    if args.turns < 1 or args.calls < 1:
        ap.error("--turns and --calls must be at least 1")
    torch.set_num_threads(1)
    logits = torch.randn(VOCAB)
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in SETUPS}
    for turn in range(1, args.turns + 1):
        for name, fraction in SETUPS:
            seen[name].append(measure(fraction, args.calls, logits))
        print(f"turn {turn}/{args.turns}", flush=True)
    print(f"{'setup':10s} | us outside the timed pass, each turn | us of host work after the pass, each turn")
    for name, got in seen.items():
        print(f"{name:10s} | {' '.join(f'{o:6.1f}' for o, _ in got)} | {' '.join(f'{a:6.0f}' for _, a in got)}")


if __name__ == "__main__":
    main()
