"""What runs: the registry, the one resolver, the models and the prompts.

registry (matrix.toml, and a user registry merged over it, as validated dataclasses), selection
(what runs, resolved once, with where each value came from), models (fetch, cache, load at a
precision), drafthead (a draft scoring a frequent-token subset), attention, prompts, and decode
(the decoding settings the resolver builds). May import: core, machine.
"""
