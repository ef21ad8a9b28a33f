"""w6a16: AWQ (quant/awq.py: the same activation-aware scale search and folding) with 6-bit
weights per group of 128 input channels instead of 4, bf16 activations.

The CPU path: torch has no 6-bit kernel. The 6-bit values are held in int8 and run through
aten._weight_int8pack_mm (the w8abf16 kernel), whose scales are one per output row; the group
scales are made exact there by restricting each group's step to 1-4 times the row's step
(quant.layers.int6_groups), so q * m fits int8 and the kernel computes the 6-bit weights exactly.
Packing 6-bit values and unpacking them per group would save a quarter of the bytes, but torch
ships no kernel for it, and unpacking in Python would dequantize every weight on every call. So
this layer reads int8's bytes: it decodes at w8abf16's speed, with 6-bit rounding."""

from __future__ import annotations

from quant.awq import INT6, for_scheme

quantize = for_scheme(INT6)
