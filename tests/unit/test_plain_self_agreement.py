"""benchmarks/plain_self_agreement.py: how far plain decoding's tokens lie below the top-1 of one
forward pass over the same tokens (the measurement behind the near-tie epsilon)."""

from __future__ import annotations

import pytest
import torch

from bench_scripts import script_module
from tiny_models import prompt, tiny_model


def greedy(model, ids, n):
    """Plain greedy decoding with the KV cache, one token a pass."""
    out, past, step = [], None, ids
    with torch.no_grad():
        for _ in range(n):
            o = model(step, past_key_values=past, use_cache=True)
            past, token = o.past_key_values, int(o.logits[0, -1].argmax())
            out.append(token)
            step = torch.tensor([[token]])
    return out


def test_fp32_decoding_agrees_with_one_pass_and_another_token_does_not():
    model, ids = tiny_model("llama", seed=0).eval(), prompt(length=12)
    tokens = greedy(model, ids, 10)
    with script_module("plain_self_agreement") as script:
        row = script.prompt_row(model, ids, tokens)
        assert row == {"positions": 10, "max_below_top1": 0.0, "other_argmax": 0}
        with torch.no_grad():  # the 5th token replaced by the pass's lowest-scored one
            logits = model(torch.cat([ids, torch.tensor([tokens])], dim=1)).logits[0, ids.shape[1] + 3]
        planted = tokens[:4] + [int(logits.argmin())] + tokens[5:]
        wrong = script.prompt_row(model, ids, planted)
        assert wrong["other_argmax"] >= 1
        assert wrong["max_below_top1"] == pytest.approx((logits.max() - logits.min()).item(), abs=1e-3)


def test_bad_token_count_names_the_option(capsys):
    with script_module("plain_self_agreement") as script, pytest.raises(SystemExit):
        script.parse_args(["--new-tokens", "0"])
    assert "--new-tokens 0" in capsys.readouterr().err
