"""The measurement core: what every other room builds on.

registry (matrix.toml as dataclasses), models (fetch, cache, load at a precision), platform
(this machine's identity), prompts, decode (decoding settings and their one builder), generate
(one measured `generate` call), record (the result record and the table's columns), interleave
(ABBA order and warm-up), bench (a benchmark run), report (tables and results JSON), jsonio and
errors. May import: quant, and nothing else of harness outside core.
"""
