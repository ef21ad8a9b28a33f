"""assisted-bench: performance and accuracy regression suite for LLM assisted generation."""

__version__ = "0.1.0"
