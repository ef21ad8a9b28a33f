"""`python -m harness doctor`: what this machine is, which kernels run here, what they cost at
M = 1..8 tokens, and the speedup those costs predict for the pair (in under a minute).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.workload import registry, selection
from harness.core.errors import HarnessError, UnknownNameError

if TYPE_CHECKING:
    from harness.measure.record import GenerationResult

TOKENS = tuple(range(1, 9))


def add_parser(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("doctor", help="this machine's CPU class, kernels and their costs, the pair's predicted speedup")
    d.add_argument("--pair", help="registry pair (default: the registry's defaults.pair)")
    d.add_argument("--precisions", help="comma-separated precisions to time (default: every one)")
    d.add_argument("--preset", metavar="NAME", help="predict for the pair's preset on this CPU class (e.g. "
                                                    "fastest) instead of its chosen precisions")
    d.add_argument("--no-models", action="store_true",
                   help="kernels only: do not load the pair (no step costs, no prediction)")
    d.add_argument("--json", type=Path, metavar="PATH", help="also write the findings as JSON")


def _largest_linear(path: Path) -> tuple[int, int]:
    """(in, out) of a model's MLP up projection, the largest linear layer per block, from config.json."""
    cfg = json.loads((path / "config.json").read_text())
    hidden = cfg.get("hidden_size") or cfg.get("d_model") or cfg.get("n_embd")
    inter = cfg.get("intermediate_size") or cfg.get("ffn_dim") or cfg.get("n_inner") or 4 * hidden
    return int(hidden), int(inter)


def _say(text: str = "") -> None:
    print(text, flush=True)


def _cost_table(title: str, shape: tuple[int, int], precisions: list[str]) -> list[dict[str, Any]]:
    from harness.machine import kernels

    _say(f"\n{title} {shape[0]}x{shape[1]}: ms for one token, then the cost of M tokens in one call / one token")
    _say(f"  {'precision':14s} {'kernel':34s} {'M=1 ms':>7s} " + " ".join(f"{'M=' + str(m):>5s}" for m in TOKENS[1:]))
    out = []
    for p in precisions:
        c = kernels.layer_cost(p, *shape, tokens=TOKENS, min_seconds=0.05)
        if c.error:
            _say(f"  {p:14s} {kernels.kernel_name(p):34s} does not run here: {c.error}")
        else:
            _say(f"  {p:14s} {kernels.kernel_name(p):34s} {c.ms[1]:7.2f} "
                 + " ".join(f"{c.ratio(m):5.2f}" for m in TOKENS[1:]))
        out.append({"precision": p, "shape": list(shape), "ms": {str(m): round(v, 4) for m, v in c.ms.items()},
                    "error": c.error})
    return out


def run(matrix: registry.Matrix, args: argparse.Namespace) -> int:
    from harness.machine import capability, kernels
    from harness.workload import models
    from harness.machine.platform import detect

    started = time.perf_counter()
    # what the prediction runs: 48 greedy tokens of the pair's first decode prompt
    sel = selection.resolve(matrix, selection.Request(pair=args.pair, preset=args.preset, task="decode",
                                                      max_new_tokens=48, check_here=False))
    cap = capability.detect()
    plat = detect("cpu")
    precisions = [p.strip() for p in args.precisions.split(",")] if args.precisions else list(kernels.KERNEL)
    for p in precisions:
        if p not in kernels.KERNEL:
            raise UnknownNameError("precision", p, kernels.KERNEL, where="--precisions")
    report: dict[str, Any] = {"platform": plat.as_dict(), "capability": cap.as_dict(), "pair": sel.pair,
                              "selection": sel.as_dict()}
    _say(f"platform   {plat.id} ({plat.cpu_model}, {plat.cpu_count} cores, torch {plat.torch})")
    _say(f"CPU class  {cap.why}")
    _say(f"           {capability.DESCRIPTION[cap.name]}")
    _say(f"ISA flags  {' '.join(cap.flags) or '(none of those that matter)'}")
    _say(f"pair       {sel.pair}: {sel.headline(names=False)}")
    for reason in sel.reasons:
        _say(f"           {reason}")

    try:
        target_path = models.resolve_path(sel.target.spec)
    except HarnessError as exc:
        _say(f"\n(the pair's models are not here: {exc}; timing a 1536x8960 layer instead)")
        target_path = None
    shape = _largest_linear(target_path) if target_path else (1536, 8960)
    report["target_layer"] = _cost_table("target's largest linear layer", shape, precisions)
    if sel.draft and target_path:
        draft_shape = _largest_linear(models.resolve_path(sel.draft.spec))
        report["draft_layer"] = _cost_table("draft's largest linear layer", draft_shape,
                                            [p for p in precisions if p in (sel.draft.precision, "bf16", "fp32")])

    if not args.no_models and target_path:
        report["prediction"] = _predict(sel)
    _say(f"\ndoctor finished in {time.perf_counter() - started:.0f} s")
    if args.json:
        from harness.core import jsonio

        jsonio.atomic_write_text(args.json, json.dumps(report, indent=1) + "\n")
        print(f"results: {args.json}")
    return 0


def _predict(sel: "selection.Selection") -> dict[str, Any]:
    """Step costs of the selection's models and the speedup they predict for an acceptance measured here."""
    from harness.machine import predict
    from harness.workload import models, prompts
    from harness.measure.generate import measure_generation

    k = sel.k
    _say(f"\nloading the pair (target {sel.target.precision}" + (f", draft {sel.draft.precision})" if sel.draft else ")"))
    target = models.load(sel.target.spec, sel.target.precision)
    draft = (models.load(sel.draft.spec, sel.draft.precision, draft_vocab=sel.draft.draft_vocab)
             if sel.draft else None)
    by_k_costs = predict.measure(target.model, draft.model if draft else None, sorted({*range(1, 9), k}),
                                 min_seconds=0.2)
    costs = by_k_costs[k]
    verify = {1: costs.target_ms, **{kk + 1: c.verify_ms for kk, c in by_k_costs.items()}}
    _say(f"step costs (128 cached tokens): target one token {costs.target_ms:.1f} ms; "
         f"K+1 = {k + 1} tokens {costs.verify_ms:.1f} ms (r = {costs.r:.2f})"
         + (f"; draft one token {costs.draft_ms:.1f} ms (c = {costs.c:.2f})" if draft else ""))

    first = prompts.load_prompts(sel.prompt_set, target.tokenizer, limit=1)[0]
    ids = prompts.encode(first, target.tokenizer, chat_template=sel.prompt_set.chat_template)
    result = measure_generation(target.model, ids, sel.decode, mode=sel.mode, k=k,
                                assistant=draft.model if draft else None, tokenizer=target.tokenizer)
    e = result.mean_accepted_length or 1.0
    alpha = predict.alpha_for(e, k)
    pred = costs.predict(e)
    _say(f"acceptance on {first.id} (48 tokens): {e:.2f} tokens per verification step at K={k} "
         f"(per-token alpha {alpha:.2f})")
    _say(f"predicted speedup at K={k}: {pred:.2f}x = E / (K c + r) = {e:.2f} / ({k} x {costs.c:.2f} + {costs.r:.2f})")
    by_k = {}
    for kk in range(1, 9):
        by_k[kk] = by_k_costs[kk].predict(predict.expected_tokens(alpha, kk))
    best = max(by_k, key=by_k.get)
    _say("predicted by K (same alpha): " + "  ".join(f"K={kk} {v:.2f}x" for kk, v in by_k.items())
         + f"  -> best K={best}")
    against = None
    reference = sel.reference_precision
    if reference and reference != sel.target.precision:
        ref = models.load(sel.target.spec, reference)
        ref_ms = predict.forward_ms(ref.model, 128, 1, min_seconds=0.2)
        del ref
        against = {"precision": reference, "target_ms": round(ref_ms, 3),
                   "predicted_ratio": pred * ref_ms / costs.target_ms}
        _say(f"against plain {reference} ({ref_ms:.1f} ms a token): predicted {against['predicted_ratio']:.2f}x its "
             f"tokens/s = {pred:.2f} x {ref_ms:.1f} / {costs.target_ms:.1f}")
    if pred < 1.0:
        _say(f"WARNING: assisted decoding is predicted SLOWER than plain here ({pred:.2f}x): verifying "
             f"{k + 1} tokens costs {costs.r:.1f} one-token steps; see the per-class choices in harness/matrix.toml")
    plain = measure_generation(target.model, ids, sel.decode, tokenizer=target.tokenizer)
    return {"costs": costs.as_dict(), "verify_ms": {str(m): round(v, 3) for m, v in sorted(verify.items())},
            "prompt": first.id, "mean_accepted_length": e, "alpha": alpha, "predicted_speedup": pred,
            "predicted_by_k": {str(kk): round(v, 3) for kk, v in by_k.items()}, "against_reference": against,
            "run_split": _run_split(plain, result, k)}


def _run_split(plain: "GenerationResult", assisted: "GenerationResult", k: int) -> dict[str, Any] | None:
    """The same split bench prints, from the 48-token runs themselves: each phase's passes, the
    host overhead, and the speedup the run's own step costs predict beside the measured one."""
    from harness.measure import phases

    if not (plain.phases and assisted.phases and plain.time_per_token_ms and assisted.time_per_token_ms):
        return None
    out: dict[str, Any] = {}
    for name, r in (("plain", plain), ("assisted", assisted)):
        account = phases.accounting(r.phases, r.decode_tokens, r.decode_s * 1000.0)
        _say(f"{name} run, phases from the run itself:")
        drafted, accepted = r.draft_steps()
        for line in phases.lines(r.phases, account, phases.acceptance_by_position(
                [drafted], [accepted]) if r.drafted_per_step else None):
            _say(f"  {line}")
        out[name] = {"phases": {p: c.as_dict() for p, c in r.phases.items()},
                     "accounting": account.as_dict() if account else None}
    measured = plain.time_per_token_ms / assisted.time_per_token_ms
    out["measured_speedup"] = measured
    costs = phases.step_costs(plain.phases, assisted.phases, k)
    if costs and assisted.mean_accepted_length:
        out["predicted_speedup"] = predicted = costs.predict(assisted.mean_accepted_length)
        _say(f"measured speedup {measured:.2f}x; the run's own step costs predict {predicted:.2f}x "
             f"(c = {costs.c:.2f}, r = {costs.r:.2f}; host overhead excluded)")
    return out


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run: python -m harness doctor")
