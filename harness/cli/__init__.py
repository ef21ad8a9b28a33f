"""`python -m harness ...`: main.py builds the parser and dispatches; one module per command group
(bench, models, humaneval, sandbox) holds its options and commands. Prints; the library logs.
May import: every room.
"""
