"""Tiny random-weight models of the seeds' architectures, built in the test (no downloads)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, OPTConfig, Qwen2Config

VOCAB = 96
ARCHITECTURES = ("opt", "llama", "qwen2")


def tiny_config(arch: str, *, layers: int = 2, hidden: int = 64):
    common = dict(vocab_size=VOCAB, num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=4,
                  max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "opt":
        return OPTConfig(ffn_dim=hidden * 2, word_embed_proj_dim=hidden, **common)
    if arch == "llama":
        return LlamaConfig(intermediate_size=hidden * 2, num_key_value_heads=2, **common)
    if arch == "qwen2":
        return Qwen2Config(intermediate_size=hidden * 2, num_key_value_heads=2, **common)
    raise ValueError(arch)


def tiny_model(arch: str, seed: int, **kwargs) -> torch.nn.Module:
    """A random model whose greedy continuations are not degenerate (scaled-up logits)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **kwargs), dtype=torch.float32).eval()
    # never stop early: the counters are compared over full-length generations
    model.generation_config.eos_token_id = None
    model.config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def counted_prepacks(monkeypatch) -> list[int]:
    """The sizes (elements) of the weights fbgemm's prepack is given from now until monkeypatch.undo()."""
    packed: list[int] = []
    prepack = torch.ops.quantized.linear_prepack

    def counted(weight, bias=None):
        packed.append(weight.numel())
        return prepack(weight, bias)

    monkeypatch.setattr(torch.ops.quantized, "linear_prepack", counted)
    return packed


def prompt(seed: int = 0, length: int = 12) -> torch.LongTensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (1, length), generator=g)


def perturbed(model: torch.nn.Module, scale: float, seed: int) -> torch.nn.Module:
    """A copy of `model` with noise on every weight: a draft that agrees only part of the time."""
    import copy

    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * (p.std() if p.numel() > 1 else 1.0))
    return draft


def word_tokenizer():
    """A real fast tokenizer over VOCAB words ('w3', 'w4', ...), for models built in tests."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def write_local_matrix(root, arch: str = "llama"):
    """Save a tiny target and draft (with tokenizer) under root and write a registry that names
    them as `local` models, with a JSONL prompt set. Returns the registry path."""
    root = Path(root)
    _save_tiny_pair(root, arch)
    _write_prompts(root / "prompts.jsonl")
    (root / "matrix.toml").write_text(LOCAL_MATRIX_TOML)
    return root / "matrix.toml"


def _save_tiny_pair(root: Path, arch: str) -> None:
    """Save a tiny target and a perturbed copy as its draft, each beside the word tokenizer."""
    tok = word_tokenizer()
    for name, model in (("target", tiny_model(arch, 0)), ("draft", perturbed(tiny_model(arch, 0), 0.5, 7))):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)


def _write_prompts(path: Path) -> None:
    """Write three 10-word prompts over the tokenizer's vocabulary as JSONL (the `tiny-prompts` set)."""
    prompts = [{"id": f"p{i}", "text": " ".join(f"w{(i * 7 + j) % (VOCAB - 3) + 3}" for j in range(10))}
               for i in range(3)]
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))


# The registry write_local_matrix writes: the saved pair as `local` models, a prompt-lookup pair on
# the target, the JSONL, corpus and HumanEval prompt sets, the task mapping and a small CPU perf gate.
LOCAL_MATRIX_TOML = '''
schema_version = 1
[defaults]
pair = "tiny+draft"
task = "decode"
max_new_tokens = 24
repeats = 1
schedule = "constant"
confidence_threshold = 0.0
prompt_lookup_ngram = 3
[models.tiny-target]
source = "local"
path = "target"
[models.tiny-draft]
source = "local"
path = "draft"
[pairs."tiny+draft"]
target = "tiny-target"
draft = "tiny-draft"
target_precision = "fp32"
draft_precision = "fp32"
num_assistant_tokens = 4
prompt_set = "tiny-prompts"
[pairs."tiny+lookup"]
target = "tiny-target"
mode = "prompt-lookup"
target_precision = "fp32"
num_assistant_tokens = 3
prompt_set = "tiny-prompts"
[platforms.cpu]
device = "cpu"
[prompt_sets.tiny-prompts]
source = "jsonl"
path = "prompts.jsonl"
[prompt_sets.lengths]
source = "corpus"
corpus = "pydoc_data.topics"
lengths = [8, 16]
[prompt_sets.humaneval-all]
source = "humaneval"
[tasks]
decode = "pair"
benchmark = "lengths"
benchmark_code = "humaneval-all"
[perf]
max_new_tokens = 48
prompts = 1
rounds = 3
batch = 3
max_rounds = 6
drift_block = 4
tolerance_floor = 0.05
sampling = { temperature = 0.1, top_p = 0.95 }
[[perf.combinations]]
pair = "tiny+draft"
precisions = ["fp32+fp32"]
platforms = ["cpu"]
decoding = ["greedy"]
[[perf.combinations]]
pair = "tiny+lookup"
precisions = ["fp32"]
platforms = ["cpu"]
decoding = ["greedy"]
'''
