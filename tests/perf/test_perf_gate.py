"""The perf gate: one test per target/draft/platform/precision/decoding combination of
harness/matrix.toml's [perf] table, each against this machine's baseline (baselines/)."""

from harness.perf.gates import run_gate


def test_perf(perf_session, perf_combination, request):
    run_gate(perf_session, perf_combination, request)
