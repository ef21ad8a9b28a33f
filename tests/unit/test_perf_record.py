"""The perf gate's records have one source, harness/perf/record.py: results.json's schema must
agree with its dataclasses field by field, a round from a worker is checked as it arrives, and
both gates speak one outcome vocabulary (harness/perf/outcome.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from harness.core import jsonio
from harness.core.errors import ResultsError
from harness.perf import report
from harness.perf.outcome import Outcome, combine, settled
from harness.perf.record import METRICS, ABDetail, CombinationResult, RecordError, Round

SCHEMA = json.loads(report.SCHEMA.read_text())
DEFS = SCHEMA["$defs"]


def names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("cls, node", [(CombinationResult, "result"), (Round, "round"), (ABDetail, "ab")])
def test_the_schema_holds_exactly_the_dataclass_fields(cls, node):
    assert set(DEFS[node]["properties"]) == names(cls)
    assert set(DEFS[node]["required"]) == names(cls)  # every field is written, None where it does not apply


def test_the_schemas_name_exactly_the_phases_a_round_and_a_bench_run_record():
    from harness.measure import phases
    from harness.workload.registry import PACKAGE_DIR
    from harness.perf.record import ROUND_PHASES

    round_phases = DEFS["round"]["properties"]["phases"]["oneOf"][1]["propertyNames"]["enum"]
    assert sorted(round_phases) == sorted(ROUND_PHASES)
    bench = json.loads((PACKAGE_DIR / "schemas" / "bench-results.schema.json").read_text())
    assert sorted(bench["$defs"]["phases"]["oneOf"][1]["propertyNames"]["enum"]) == sorted(phases.PHASES)


def test_every_metric_is_a_round_field_and_the_verdicts_are_the_outcomes():
    assert set(METRICS) <= names(Round)
    result_verdicts = set(DEFS["result"]["properties"]["verdict"]["enum"])
    assert result_verdicts == {o.value for o in Outcome} - {Outcome.INCONCLUSIVE.value}
    decision = DEFS["result"]["properties"]["decisions"]["additionalProperties"]["properties"]["verdict"]["enum"]
    assert set(decision) == {o.value for o in Outcome if o.gated}


def a_round(**over) -> Round:
    doc = {"plain_tokens_per_sec": 3.0, "assisted_tokens_per_sec": 7.5, "speedup": 2.5, "cpu_s": 1.0, "wall_s": 1.1,
           "counters": {"p0": {"new_tokens": 32, "drafted": 30, "accepted": 25, "target_forwards": 7}}}
    return Round.from_json({**doc, **over}, "worker base")


def results_doc(*results: CombinationResult) -> dict:
    return {"schema_version": report.SCHEMA_VERSION, "harness_version": "x", "created": "now", "provenance": None,
            "results": [r.to_json() for r in results]}


def test_a_result_of_each_gate_is_valid_and_a_field_out_of_place_is_not():
    stored = CombinationResult("c", "p", "stored", Outcome.PASS, [a_round()], 0.8, exact=Outcome.PASS)
    detail = ABDetail("HEAD abc", "working tree def", "duet", [a_round(cpu=1)], {m: [1.0] for m in METRICS}, 0, 0, [])
    ab = CombinationResult("c", "p", "ab", Outcome.REGRESSION, [a_round(cpu=0)], ab=detail)
    deferred = CombinationResult("c", "p", "stored", Outcome.DEFERRED, [], notes=["why"],
                                 host={"ratios": {}, "threshold": 0.25, "comparable": False, "headline": "x", "probe": {}})
    jsonio.validate(results_doc(stored, ab, deferred), report.SCHEMA, "results", ResultsError)
    for broken in (dataclasses.replace(ab, ab=None), dataclasses.replace(stored, ab=detail),
                   dataclasses.replace(stored, rounds=[])):
        with pytest.raises(ResultsError):
            jsonio.validate(results_doc(broken), report.SCHEMA, "results", ResultsError)


@pytest.mark.parametrize("field, value", [("speedup", 0), ("plain_tokens_per_sec", float("nan")),
                                          ("assisted_tokens_per_sec", "7"), ("counters", {"p0": {"drafted": 1}}),
                                          ("page_faults", -1), ("page_faults", 2.5), ("page_faults", True)])
def test_a_worker_round_that_is_not_a_round_is_named(field, value):
    with pytest.raises(RecordError, match=f"worker base: round field '{field}'"):
        a_round(**{field: value})


def test_one_vocabulary_for_a_combination():
    assert combine([Outcome.PASS, Outcome.IMPROVEMENT]) == Outcome.IMPROVEMENT
    assert combine([Outcome.PASS, Outcome.UNDECIDED, Outcome.IMPROVEMENT]) == Outcome.UNDECIDED
    assert combine([Outcome.UNDECIDED, Outcome.REGRESSION]) == Outcome.REGRESSION
    assert combine([Outcome.PASS], behaviour_changed=True) == Outcome.REGRESSION  # greedy counters differ
    assert settled([Outcome.REGRESSION, Outcome.INCONCLUSIVE]) and not settled([Outcome.PASS, Outcome.INCONCLUSIVE])
    assert not Outcome.DEFERRED.gated and not Outcome.STAGED.gated and Outcome.UNDECIDED.gated


def test_an_arm_environment_in_results_is_what_the_environment_writes():
    from harness.perf.ab.environment import current

    written = current().to_json()
    assert set(DEFS["environment"]["properties"]) == set(DEFS["environment"]["required"]) == set(written)
    detail = ABDetail("HEAD abc", "working tree def", "duet", [a_round(cpu=1)], {m: [1.0] for m in METRICS}, 0, 0, [],
                      environments={"base": written, "candidate": written, "differences": {"torch": ["2.13.0", None]}})
    jsonio.validate(results_doc(CombinationResult("c", "p", "ab", Outcome.PASS, [a_round(cpu=0)], ab=detail)),
                    report.SCHEMA, "results", ResultsError)


def test_recordings_of_every_earlier_schema_replay_and_a_swap_or_stand_in_out_of_range_is_not_a_record(tmp_path):
    """A side-by-side gate records the period at which its arms exchanged cores within a round and the
    rounds its stand-in covered; a recording from before those fields (or before the environments, the
    rounds' phases or the provenance: every version the harness replays, 2 on) is given them as null
    and replays."""
    from harness.perf.replay import Recording

    detail = ABDetail("HEAD abc", "working tree def", "duet", [a_round(cpu=1)], {m: [1.0] for m in METRICS}, 0, 0, [],
                      swap_s=0.25, stand_in_rounds=1, synced_rounds=1)
    doc = results_doc(CombinationResult("c", "p", "ab", Outcome.PASS, [a_round(cpu=0)], ab=detail))
    jsonio.validate(doc, report.SCHEMA, "results", ResultsError)
    for field, bad in (("swap_s", 0), ("swap_s", -0.25), ("swap_s", "0.25"),
                       ("stand_in_rounds", -1), ("stand_in_rounds", 0.5), ("stand_in_rounds", "1"),
                       ("synced_rounds", -1), ("synced_rounds", 0.5), ("synced_rounds", "1")):
        broken = json.loads(json.dumps(doc))
        broken["results"][0]["ab"][field] = bad
        with pytest.raises(ResultsError, match=field):
            jsonio.validate(broken, report.SCHEMA, "results", ResultsError)
    v8 = json.loads(json.dumps(doc))
    v8["schema_version"] = 8
    for rounds in (v8["results"][0]["rounds"], v8["results"][0]["ab"]["base_rounds"]):
        for r in rounds:
            del r["page_faults"]
    v7 = json.loads(json.dumps(v8))
    v7["schema_version"] = 7
    del v7["results"][0]["ab"]["synced_rounds"]
    v6 = json.loads(json.dumps(v7))
    v6["schema_version"] = 6
    del v6["results"][0]["ab"]["stand_in_rounds"]
    v5 = json.loads(json.dumps(v6))
    v5["schema_version"] = 5
    del v5["results"][0]["ab"]["swap_s"]
    v4 = json.loads(json.dumps(v5))
    v4["schema_version"] = 4
    del v4["results"][0]["ab"]["environments"]
    v3 = json.loads(json.dumps(v4))
    v3["schema_version"] = 3
    for rounds in (v3["results"][0]["rounds"], v3["results"][0]["ab"]["base_rounds"]):
        for r in rounds:
            del r["phases"], r["acceptance_by_position"]
    v2 = json.loads(json.dumps(v3))
    v2["schema_version"] = 2
    del v2["provenance"]
    for version, old in ((9, doc), (8, v8), (7, v7), (6, v6), (5, v5), (4, v4), (3, v3), (2, v2)):
        path = tmp_path / f"v{version}.json"
        path.write_text(json.dumps(old))
        gate = Recording.load(path).gates["c"]
        assert gate.mode == "duet" and len(gate.base_rounds) == 1, version
