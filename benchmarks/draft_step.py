"""Where one draft step's time goes, against the weight-reading floor (issue 30, item 1).

A draft step is one forward pass of the draft model on one token with a warm KV cache. This loads
the pair's draft at its precision (the registry's choice for this CPU class, or --draft-precision),
prefills one HumanEval prompt, and then measures, with the threads a bench run uses:

  step        one token through `model(...)` with the KV cache, call by call (median, p10)
  generate    the draft's own `generate(max_new_tokens=K)` from the same cache, as the assisted
              loop calls it once per step: its wall time over K, minus a forward pass, is what
              `generate` adds per drafted token
  ops         torch.profiler over the steps: self CPU time per operator, grouped (int8 GEMM, the
              activations' quantization, attention, norms and element-wise ops, the rest)
  floor       the bytes of weights a step reads, over this machine's read bandwidth (a torch sum
              over 512 MiB, same threads): what a step cannot go below

    python benchmarks/draft_step.py                       # the default pair's draft
    python benchmarks/draft_step.py --fused                # the same draft in its fused loop (--fused-draft)
    python benchmarks/draft_step.py --steps 64 --out benchmarks/data/draft_step_avx512-bf16.json

Run it with nothing else on the machine: every figure here is a wall time.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from harness.core import jsonio
from harness.workload import models, prompts
from harness.workload.registry import load_matrix
from harness.workload.selection import Request, resolve

log = logging.getLogger("draft_step")

# profiler operator names (substrings) -> what they are in a decode step
GROUPS = (
    ("int8 GEMM", ("quantized::linear_dynamic", "fbgemm", "_int_mm", "int8", "_weight_int8pack_mm")),
    ("activation quantization", ("quantize_per_tensor", "_choose_qparams", "dynamic_quant", "aminmax")),
    ("attention", ("scaled_dot_product", "_flash_attention", "softmax", "bmm", "baddbmm")),
    ("float GEMM", ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul")),
    ("cache and copies", ("aten::cat", "aten::copy_", "aten::index", "aten::slice", "aten::clone",
                          "aten::contiguous", "aten::to", "aten::_to_copy", "aten::empty", "aten::view",
                          "aten::reshape", "aten::transpose", "aten::expand", "aten::unsqueeze")),
    ("norms and element-wise", ("aten::mul", "aten::add", "aten::pow", "aten::mean", "aten::rsqrt",
                                "aten::silu", "aten::neg", "aten::cos", "aten::sin", "aten::sub",
                                "aten::div", "aten::rms_norm", "aten::embedding")),
)


def group_of(name: str) -> str:
    for group, needles in GROUPS:
        if any(n in name for n in needles):
            return group
    return "other"


def read_bandwidth_gbs(mib: int = 512, repeats: int = 7) -> float:
    """GB/s of a torch sum over a buffer far larger than the caches (median of `repeats`)."""
    buf = torch.ones(mib * 1024 * 1024 // 4, dtype=torch.float32)
    buf.sum()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        buf.sum()
        times.append(time.perf_counter() - t0)
    return buf.numel() * 4 / statistics.median(times) / 1e9


def weight_bytes(model: torch.nn.Module) -> dict[str, int]:
    """Bytes a one-token step reads: parameters and buffers (the input embedding's one row only,
    unless the output layer shares it) and the int8 weights packed inside torch's dynamically
    quantized linear layers."""
    embed = model.get_input_embeddings()
    head_weight = getattr(model.get_output_embeddings(), "weight", None)
    shared = isinstance(head_weight, torch.Tensor) and head_weight is getattr(embed, "weight", None)
    out = {"weights": 0, "embedding_row": 0, "int8_packed": 0}
    for _, t in [*model.named_parameters(), *model.named_buffers()]:  # tied tensors once
        if embed is not None and t is embed.weight and not shared:
            out["embedding_row"] += t.shape[-1] * t.element_size()
        else:
            out["weights"] += t.numel() * t.element_size()
    for module in model.modules():
        if hasattr(module, "_packed_params") and callable(getattr(module, "weight", None)):
            out["int8_packed"] += module.weight().numel()  # torch.ao dynamic Linear: one byte a weight
    return out


class _Steps:
    """One-token steps of the model over its KV cache, after a prompt; `fed` is what the cache holds."""

    def __init__(self, model: torch.nn.Module, input_ids: torch.Tensor) -> None:
        from transformers import DynamicCache

        self.model, self.input_ids = model, input_ids
        self.cache = DynamicCache(config=model.config)
        out = model(input_ids=input_ids, past_key_values=self.cache, use_cache=True)
        self.token = out.logits[:, -1:].argmax(-1)
        self.position = input_ids.shape[1]
        self.fed: list[torch.Tensor] = []

    def step(self) -> None:
        out = self.model(input_ids=self.token, past_key_values=self.cache, use_cache=True,
                         cache_position=torch.tensor([self.position]))
        self.fed.append(self.token)
        self.token = out.logits[:, -1:].argmax(-1)
        self.position += 1


class _FusedSteps(_Steps):
    """The same steps through the fused draft loop (harness/workload/fused_draft.py, --fused-draft)."""

    def __init__(self, model: torch.nn.Module, input_ids: torch.Tensor) -> None:
        from harness.workload.fused_draft import fused

        self.model, self.input_ids, self.loop = model, input_ids, fused(model)
        self.loop.length = 0
        self.token = self.loop(input_ids).argmax(-1, keepdim=True)
        self.position = input_ids.shape[1]
        self.fed = []

    def step(self) -> None:
        logits = self.loop(self.token)
        self.fed.append(self.token)
        self.token = logits.argmax(-1, keepdim=True)
        self.position += 1


def time_steps(steps: _Steps, n: int, warmup: int = 3) -> list[float]:
    """Milliseconds of each of n one-token steps (after `warmup` untimed ones)."""
    out = []
    for i in range(n + warmup):
        t0 = time.perf_counter()
        steps.step()
        if i >= warmup:
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def profile_steps(steps: _Steps, n: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Self CPU milliseconds a step per operator group, and the top operators, over n steps."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            steps.step()
    by_group: dict[str, float] = defaultdict(float)
    top = []
    for evt in prof.key_averages():
        by_group[group_of(evt.key)] += evt.self_cpu_time_total / 1e3 / n
        top.append((evt.self_cpu_time_total / 1e3 / n, evt.key, evt.count // n))
    top.sort(reverse=True)
    return (dict(sorted(by_group.items(), key=lambda kv: -kv[1])),
            [{"op": name, "ms_per_step": ms, "calls_per_step": calls} for ms, name, calls in top[:15]])


def time_generate(steps: _Steps, k: int, calls: int) -> list[float]:
    """Milliseconds of the model's own generate(max_new_tokens=k) from the cache, as the assisted
    loop calls it once a step (the cache cut back to the same text before each call)."""
    context = torch.cat([steps.input_ids, *steps.fed], dim=1)
    cache = steps.cache

    def keep(cache: Any, tokens: int) -> None:  # this transformers crops by a negative count to remove
        if cache.get_seq_length() > tokens:
            cache.crop(tokens - cache.get_seq_length())

    out = []
    for i in range(calls + 1):
        keep(cache, context.shape[1] - 1)
        t0 = time.perf_counter()
        res = steps.model.generate(input_ids=context, past_key_values=cache, max_new_tokens=k, min_new_tokens=k,
                                   do_sample=False, attention_mask=torch.ones_like(context),
                                   return_dict_in_generate=True, output_scores=True, pad_token_id=0)
        if i:
            out.append((time.perf_counter() - t0) * 1e3)
        cache = res.past_key_values
    return out


@torch.inference_mode()
def measure(model: torch.nn.Module, input_ids: torch.Tensor, n: int, k: int, *, fused: bool = False) -> dict[str, Any]:
    steps = (_FusedSteps if fused else _Steps)(model, input_ids)
    step_ms = time_steps(steps, n)
    groups, top = profile_steps(steps, n)
    step_median = statistics.median(step_ms)
    # the fused loop drafts with a bare argmax a token: nothing like generate's per-token work to time
    gen_per_token = step_median if fused else statistics.median(time_generate(steps, k, max(4, n // k))) / k
    return {
        "fused": fused, "steps": n, "context_tokens": input_ids.shape[1],
        "step_ms": {"median": step_median, "p10": statistics.quantiles(step_ms, n=10)[0], "min": min(step_ms)},
        "generate_ms_per_token": gen_per_token, "generate_overhead_ms_per_token": gen_per_token - step_median,
        "profiled_ms_per_step": sum(groups.values()), "groups_ms_per_step": groups, "top_ops": top,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default=None, help="registry pair (default: the registry's default pair)")
    ap.add_argument("--draft-precision", default=None, help="default: the pair's choice for this CPU class")
    ap.add_argument("--prompt", default="HumanEval/0", help="the HumanEval task whose prompt is the context")
    ap.add_argument("--steps", type=int, default=48, help="one-token steps timed, and profiled (default 48)")
    ap.add_argument("--fused", action="store_true",
                    help="the draft's fused decode loop (bench --fused-draft) instead of transformers' forward")
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's, as bench)")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    if args.steps < 8:
        ap.error(f"--steps {args.steps}: give 8 or more")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    sel = resolve(load_matrix(), Request(pair=args.pair, draft_precision=args.draft_precision))
    if sel.draft is None:
        raise SystemExit(f"pair {sel.pair}: it has no draft model (prompt lookup)")
    print(f"draft {sel.draft.name} ({sel.draft.precision}), K={sel.k}, {torch.get_num_threads()} threads, "
          f"CPU class {sel.cpu_class}")
    loaded = models.load(sel.draft.spec, sel.draft.precision, draft_vocab=sel.draft_vocab)
    problem = prompts.humaneval_problems()[args.prompt]
    input_ids = prompts.encode(prompts.Prompt(args.prompt, problem["prompt"]), loaded.tokenizer)
    print("measuring the read bandwidth ...")
    bandwidth = read_bandwidth_gbs()
    read = weight_bytes(loaded.model)
    floor_ms = sum(read.values()) / (bandwidth * 1e9) * 1e3
    then = "" if args.fused else ", then the draft's generate"
    print(f"timing {args.steps} steps{' of the fused loop' if args.fused else ''}, profiling {args.steps} more{then} ...")
    figures = measure(loaded.model, input_ids, args.steps, sel.k, fused=args.fused)
    result = {"cpu_class": sel.cpu_class, "threads": torch.get_num_threads(), "draft": sel.draft.name, "precision": sel.draft.precision,
              "k": sel.k, "prompt": args.prompt, "bytes_read_per_step": read, "read_gb_s": bandwidth,
              "floor_ms": floor_ms, **figures}
    s = figures["step_ms"]
    print(f"step: median {s['median']:.1f} ms (p10 {s['p10']:.1f}); floor {floor_ms:.1f} ms "
          f"({sum(read.values()) / 1e6:.0f} MB at {bandwidth:.1f} GB/s)")
    print(f"generate: {figures['generate_ms_per_token']:.1f} ms a drafted token "
          f"({figures['generate_overhead_ms_per_token']:+.1f} ms over a bare step)")
    print(f"profiled {figures['profiled_ms_per_step']:.1f} ms a step:")
    for group, ms in figures["groups_ms_per_step"].items():
        print(f"  {group:<26} {ms:6.2f} ms")
    print("top operators (self CPU ms a step, calls a step):")
    for op in figures["top_ops"]:
        print(f"  {op['ms_per_step']:6.2f}  {op['calls_per_step']:4d}  {op['op']}")
    if args.out:
        jsonio.atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
