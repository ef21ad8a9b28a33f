"""Which attention implementation the models run: transformers' `attn_implementation`, chosen with
`--attention NAME` or the reference example's `--fast_attention`, the same for target and draft.

transformers picks `sdpa` by default (torch's fused scaled_dot_product_attention, which on a CPU
is a flash-attention-style kernel); `eager` is its plain matmul-softmax-matmul path; `flex_attention`
compiles the attention with torch.compile on first use. The flash_attention_* kernels need a CUDA GPU
and their own packages. Nothing is substituted silently: a request that cannot run here is an
error naming the implementations that can, and `--fast_attention` says in one line what it ran.
"""

from __future__ import annotations

import difflib
import importlib.util
from dataclasses import dataclass

from harness.core.errors import BadInputError, UnsupportedHereError

DEFAULT = "sdpa"  # transformers' own default where torch has scaled_dot_product_attention
ON_CPU = ("eager", "sdpa", "flex_attention")
GPU_ONLY = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface",
            "flash_attention_4": "flash_attn"}  # the kernel's package
FAST_ON_CPU_NOTE = ("--fast-attention: the reference's flash-attention kernel needs a CUDA GPU; on this CPU it "
                    "runs sdpa, torch's fused scaled_dot_product_attention kernel (--attention eager|sdpa|"
                    "flex_attention chooses another)")


@dataclass(frozen=True)
class AttentionChoice:
    implementation: str | None  # None: transformers' default (DEFAULT), what runs when nothing is asked
    note: str | None = None     # one line saying what a reference option ran instead, where it differs

    @property
    def label(self) -> str:
        return self.implementation or DEFAULT


def available(device: str) -> tuple[str, ...]:
    if device == "cpu":
        return ON_CPU
    return ON_CPU + tuple(name for name, package in GPU_ONLY.items() if importlib.util.find_spec(package))


def resolve(name: str | None, *, fast: bool = False, device: str = "cpu") -> AttentionChoice:
    """The implementation to load the models with, from --attention NAME and --fast_attention."""
    if fast and name is not None:
        raise BadInputError(f"--fast-attention and --attention {name}: give one of them "
                           "(--fast-attention is the fused kernel: sdpa on a CPU)")
    if fast:
        if device != "cpu" and importlib.util.find_spec(GPU_ONLY["flash_attention_2"]):
            return AttentionChoice("flash_attention_2")
        if device == "cpu":
            return AttentionChoice("sdpa", FAST_ON_CPU_NOTE)
        return AttentionChoice("sdpa", f"--fast-attention: the flash-attn package is not installed; on {device} "
                                       "it runs sdpa, torch's fused scaled_dot_product_attention")
    if name is None:
        return AttentionChoice(None)
    here = available(device)
    if name in here:
        return AttentionChoice(name)
    if name in GPU_ONLY:
        raise UnsupportedHereError(f"--attention {name}: needs a CUDA GPU and the {GPU_ONLY[name]} package; "
                           f"on {device} choose {', '.join(here)}")
    close = difflib.get_close_matches(name, [*ON_CPU, *GPU_ONLY], n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise BadInputError(f"--attention {name}: not an attention implementation.{hint} On {device}: {', '.join(here)}")
