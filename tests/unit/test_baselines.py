"""Baseline files: every bad file gives a clear error naming the file, the JSON path and the fix,
and is left unchanged; migrations are explicit; writes are atomic and per platform."""

from __future__ import annotations

import copy
import json

import pytest

from harness.machine import capability
from harness.machine.platform import platform_id
from harness.perf import combinations
from harness.perf.stored import baselines
from harness.perf.stored.baselines import BaselineError
from harness.workload import registry

PID = platform_id("cpu", "Test CPU", None, "amx", 2)  # cpu-test-amx-2c
V2_PID = "cpu-test-cpu-2c-0123abcd"  # a version-2 id: the hash covered the library versions
CID = "tiny+draft:fp32+fp32:cpu:greedy:k4"
SOFTWARE = {"python": "3.11.7", "torch": "2.13.0", "transformers": "5.23.0"}


def samples(values):
    return {"samples": values, "median": sorted(values)[len(values) // 2], "cv": 0.05,
            "drift_sd": 0.0, "drift_df": 0, "block": 8}


def record():
    return {
        "pair": "tiny+draft", "target_precision": "fp32", "draft_precision": "fp32", "mode": "assisted",
        "decoding": "greedy", "k": 4, "prompt_ids": ["p0"], "max_new_tokens": 12,
        "plain_tokens_per_sec": samples([10.0, 11.0, 10.5]), "assisted_tokens_per_sec": samples([20.0, 21.0, 19.0]),
        "speedup": samples([2.0, 1.9, 2.1]),
        "exact": {"p0": {"new_tokens": 12, "drafted": 12, "accepted": 9, "target_forwards": 3}},
        "tolerance": {"assisted_tokens_per_sec": 0.1, "plain_tokens_per_sec": 0.1, "speedup": 0.1, "source": "calibrated"},
        "versions": {**SOFTWARE, "harness": "0.1.0"}, "commit": "abc", "date": "2026-11-22",
    }


def platform():
    return {"id": PID, "device": "cpu", "cpu_model": "Test CPU", "cpu_count": 2, "isa": ["avx2", "avx512f", "amx_bf16"],
            "capability": "amx"}


def valid_doc():
    return {"schema_version": baselines.SCHEMA_VERSION, "platform": platform(), "software": dict(SOFTWARE),
            "combinations": {CID: record()}}


def write(tmp_path, text: str, name: str = PID):
    path = tmp_path / f"{name}.json"
    path.write_text(text)
    return path


def test_round_trip(tmp_path):
    path = tmp_path / f"{PID}.json"
    baselines.write(path, valid_doc())
    assert baselines.load(path, platform_id=PID) == valid_doc()
    assert baselines.load(tmp_path / "absent.json") is None


def _doc_with(change):
    doc = valid_doc()
    change(doc)
    return json.dumps(doc)


@pytest.mark.parametrize("text, message", [
    ("", "the file is empty"),
    (json.dumps(valid_doc())[:200], "not valid JSON (truncated or edited?)"),
    ("baseline: fast", "not valid JSON"),
    ('{"schema_version": 1, "schema_version": 1}', "duplicate key 'schema_version'"),
    (json.dumps(valid_doc()).replace('"median": 2.0', '"median": NaN'), "NaN is not valid JSON"),
    (json.dumps(valid_doc()).replace('"median": 2.0', '"median": 1e400'),
     f"combinations/{CID}/speedup/median: number out of range"),
    ("[1, 2]", "(top level): expected a JSON object"),
    (_doc_with(lambda d: d["combinations"][CID]["speedup"].update(median=-1)),
     f"combinations/{CID}/speedup/median: -1 is less than or equal to the minimum of 0"),
    (_doc_with(lambda d: d["combinations"][CID].pop("exact")), f"combinations/{CID}: 'exact' is a required property"),
    (_doc_with(lambda d: d["combinations"].update({"not a combination id": record()})), "combinations: 'not a combination id'"),
    (_doc_with(lambda d: d.update(schema_version=7)), "schema_version 7 is newer than this harness reads (3)"),
    (_doc_with(lambda d: d["platform"].update(torch="2.13.0")), "platform: Additional properties are not allowed ('torch'"),
    (_doc_with(lambda d: d.update(schema_version="1")), "schema_version: expected an integer"),
])
def test_bad_files_name_file_path_and_fix(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(BaselineError) as exc:
        baselines.load(path, platform_id=PID)
    assert str(path) in str(exc.value)
    assert message in str(exc.value)
    assert path.read_text() == text  # never touched


def test_schema_errors_say_how_to_fix(tmp_path):
    path = write(tmp_path, _doc_with(lambda d: d["combinations"][CID]["speedup"].update(median=-1)))
    with pytest.raises(BaselineError, match=r"git checkout -- .*pytest -m perf --perf-update-baselines"):
        baselines.load(path)


def test_another_platforms_file_is_refused(tmp_path):
    path = write(tmp_path, json.dumps(valid_doc()))
    with pytest.raises(BaselineError, match=f"'{PID}' is another machine's baseline; this machine is 'cpu-other-1c-ffff'"):
        baselines.load(path, platform_id="cpu-other-1c-ffff")
    renamed = write(tmp_path, json.dumps(valid_doc()), name="cpu-renamed-1c-0000")
    with pytest.raises(BaselineError, match=f"holds platform '{PID}' but is named 'cpu-renamed-1c-0000.json'"):
        baselines.load(renamed)


def v2_doc():
    """valid_doc() as version 2 wrote it: the versions inside `platform`, the id a hash of them all."""
    doc = valid_doc()
    doc["schema_version"] = 2
    doc["platform"].update(id=V2_PID, **doc.pop("software"))
    del doc["platform"]["capability"]
    del doc["combinations"][CID]["versions"]["python"]
    return doc


def v1_doc():
    doc = v2_doc()
    doc["schema_version"] = 1
    for entry in doc["combinations"][CID].values():
        if isinstance(entry, dict) and "samples" in entry:
            for key in ("drift_sd", "drift_df", "block"):
                entry.pop(key)
    return doc


def test_older_versions_migrate_explicitly(tmp_path, monkeypatch):
    old = v1_doc()
    old["schema_version"] = 0
    old["combos"] = old.pop("combinations")  # what a version-0 file would have called it
    path = write(tmp_path, json.dumps(old))  # named for its version-3 id: the migration makes that id
    with pytest.raises(BaselineError, match="schema_version 0 has no migration to 1"):
        baselines.load(path)

    def v0_to_v1(doc):
        doc = copy.deepcopy(doc)
        doc["combinations"] = doc.pop("combos")
        return doc

    monkeypatch.setitem(baselines.MIGRATIONS, 0, v0_to_v1)
    assert baselines.load(path, platform_id=PID) == valid_doc()
    assert json.loads(path.read_text())["schema_version"] == 0  # reading never rewrites


def test_version_1_gains_the_between_run_spread_from_its_own_rounds(tmp_path):
    old = v1_doc()
    # two blocks of 8 rounds whose levels differ by 20%: a drift the within-block spread cannot explain
    rounds = [10.0, 10.1, 9.9, 10.0, 10.2, 9.8, 10.0, 10.1] + [12.0, 12.1, 11.9, 12.0, 12.2, 11.8, 12.0, 12.1]
    old["combinations"][CID]["plain_tokens_per_sec"] = {"samples": rounds, "median": 11.0, "cv": 0.09}
    path = write(tmp_path, json.dumps(old))
    doc = baselines.load(path, platform_id=PID)
    plain = doc["combinations"][CID]["plain_tokens_per_sec"]
    assert plain["block"] == 8 and plain["drift_df"] == 1
    assert 0.1 < plain["drift_sd"] < 0.15  # sd of two block log-means 0.18 apart
    assert doc["combinations"][CID]["speedup"]["drift_df"] == 0  # 3 rounds: no whole block pair
    assert json.loads(path.read_text())["schema_version"] == 1


def test_merge_keeps_other_combinations_and_reports_changes():
    old = valid_doc()
    changed = record()
    changed["speedup"] = samples([1.5, 1.6, 1.4])
    new_id = "tiny+lookup:fp32:cpu:greedy:k3"
    new = baselines.merged(old, platform(), SOFTWARE, {CID: changed, new_id: record()})
    assert set(new["combinations"]) == {CID, new_id}
    lines = baselines.changes(old, new)
    assert any(line.startswith(f"~ {CID}: ") and "speedup 2x -> 1.5x (-25.0%)" in line for line in lines)
    assert any(line.startswith(f"+ {new_id}") for line in lines)
    assert old == valid_doc()  # inputs untouched


def test_write_validates_first_and_refuses_other_platforms(tmp_path):
    path = tmp_path / f"{PID}.json"
    path.write_text("old")
    bad = valid_doc()
    bad["combinations"][CID]["speedup"]["samples"] = []
    with pytest.raises(BaselineError, match="new baselines for"):
        baselines.write(path, bad)
    with pytest.raises(BaselineError, match="refusing to write platform"):
        baselines.write(tmp_path / "cpu-other-1c-ffff.json", valid_doc())
    assert path.read_text() == "old"


def test_version_2_moves_the_versions_out_of_the_platform_and_takes_a_hardware_id(tmp_path):
    old = v2_doc()
    old["combinations"][CID]["versions"]["torch"] = "2.12.0"  # a record keeps what it was measured with
    under_old_name = write(tmp_path, json.dumps(old), name=V2_PID)
    with pytest.raises(BaselineError, match=f"holds platform '{PID}' but is named '{V2_PID}.json'; rename it "
                                            f"\\(git mv .*{V2_PID}.json .*{PID}.json\\)"):
        baselines.load(under_old_name)
    doc = baselines.load(write(tmp_path, json.dumps(old)), platform_id=PID, cpu_class="amx")
    assert doc["schema_version"] == 3
    assert doc["platform"] == platform()  # the class from the recorded flags, no versions left in it
    assert doc["software"] == SOFTWARE
    assert doc["combinations"][CID]["versions"] == {**SOFTWARE, "torch": "2.12.0", "harness": "0.1.0"}
    assert doc["combinations"][CID]["speedup"] == record()["speedup"]  # the measurements are kept
    for flags, cls in ((["avx2", "avx512f", "avx512_bf16"], "avx512-bf16"), (["avx2", "avx512f"], "avx512"),
                       (["avx2"], "avx2"), ([], "generic")):
        older = v2_doc()
        older["platform"]["isa"] = flags
        assert baselines.migrate(older, "x")["platform"]["capability"] == cls


def test_the_committed_baseline_is_version_3_under_its_hardware_id():
    for path in baselines.DEFAULT_DIR.glob("cpu-*.json"):
        raw = json.loads(path.read_text())
        assert raw["schema_version"] == baselines.SCHEMA_VERSION, f"{path}: migrate it and commit the result"
        doc = baselines.load(path)
        assert path.stem == platform_id("cpu", doc["platform"]["cpu_model"], None, doc["platform"]["capability"],
                                        doc["platform"]["cpu_count"])


def test_a_baseline_of_another_capability_class_is_refused_with_what_to_do(tmp_path):
    doc = valid_doc()
    path = write(tmp_path, json.dumps(doc))
    with pytest.raises(BaselineError) as exc:
        baselines.load(path, platform_id=PID, cpu_class="avx2")
    message = str(exc.value)
    assert "\n" not in message and str(path) in message
    for part in ("platform/capability: measured with the 'amx' class's kernels, but this run uses the 'avx2' class",
                 "not compared", f"git checkout -- {path}", "pytest -m perf --perf-update-baselines"):
        assert part in message
    assert baselines.load(path, platform_id=PID, cpu_class="amx") == doc


def test_software_changes_name_what_changed():
    recorded = {**SOFTWARE, "harness": "0.1.0"}
    assert baselines.software_changes(recorded, {**recorded, "torch": "2.14.0"}) == ["torch 2.13.0 -> 2.14.0"]
    assert baselines.software_changes(recorded, {**recorded, "transformers": "5.24.0", "python": "3.12.1"}) == [
        "python 3.11.7 -> 3.12.1", "transformers 5.23.0 -> 5.24.0"]
    assert baselines.software_changes(recorded, {**recorded, "onednn": "3.12.0"}) == []  # not recorded there
    assert baselines.software_changes(recorded, recorded) == []


def platform_doc(tmp_path, device: str, cpu_model: str, cls: str, cores: int, combos: list[str], **software) -> dict:
    """A valid document of another platform, written to `tmp_path` under its id."""
    doc = valid_doc()
    doc["platform"] = {"id": platform_id(device, cpu_model, None, cls, cores), "device": device,
                       "cpu_model": cpu_model, "cpu_count": cores, "capability": cls}
    doc["software"].update(software)
    doc["combinations"] = {cid: record() for cid in combos}
    baselines.write(baselines.path_for(tmp_path, doc["platform"]["id"]), doc)
    return doc


def new_platform(cls: str = "avx2") -> dict:
    """The document an update is about to write for a platform without a file."""
    doc = valid_doc()
    doc["platform"] = {"id": platform_id("cpu", "Intel Xeon", None, cls, 2), "device": "cpu",
                       "cpu_model": "Intel Xeon", "cpu_count": 2, "capability": cls}
    faster = record()
    faster["speedup"] = samples([2.4, 2.5, 2.6])
    doc["combinations"] = {CID: faster, "tiny+lookup:fp32:cpu:greedy:k3": record()}
    return doc


def nearest_name(tmp_path, new) -> str:
    return baselines.nearest(tmp_path, new, baselines.path_for(tmp_path, new["platform"]["id"])).path.name


def test_the_nearest_platform_is_same_device_then_class_then_cpu_model_then_most_similar(tmp_path):
    new = new_platform("avx2")
    assert baselines.nearest(tmp_path, new, tmp_path / "x.json") is None
    platform_doc(tmp_path, "cuda", "Intel Xeon", "avx2", 2, [CID])            # same class and model, a GPU
    platform_doc(tmp_path, "cpu", "Other CPU", "avx512", 8, [CID])           # nearer class, more cores
    assert nearest_name(tmp_path, new) == "cpu-other-avx512-8c.json"          # same device first
    platform_doc(tmp_path, "cpu", "Intel Xeon", "amx", 2, [CID])              # same model, other class
    assert nearest_name(tmp_path, new) == "cpu-intel-xeon-amx-2c.json"       # then same CPU model
    platform_doc(tmp_path, "cpu", "AMD EPYC 7763", "avx2", 4, [])             # same class, nothing in common
    platform_doc(tmp_path, "cpu", "AMD EPYC 7B13", "avx2", 16, [CID])
    assert nearest_name(tmp_path, new) == "cpu-amd-epyc-7b13-avx2-16c.json"  # same class before same model,
    platform_doc(tmp_path, "cpu", "AMD EPYC 9654", "avx2", 2, [CID])          # then combinations in common,
    assert nearest_name(tmp_path, new) == "cpu-amd-epyc-9654-avx2-2c.json"   # then the nearest core count
    near = baselines.nearest(tmp_path, new, tmp_path / "x.json")
    assert near.why == ("same device (cpu), same capability class (avx2), other CPU model (AMD EPYC 9654 there, "
                        "Intel Xeon here), same core count (2), 1 of 2 combinations in common")


def test_nearest_passes_over_other_files_and_names_unreadable_ones(tmp_path):
    platform_doc(tmp_path, "cpu", "Other CPU", "avx2", 2, [CID])
    (tmp_path / "reference.json").write_text('{"schema_version": 1, "commit": "abc"}')
    (tmp_path / "schema.json").write_text(baselines.SCHEMA_PATH.read_text())
    (tmp_path / "cpu-broken-avx2-2c.json").write_text('{"platform": {}, "combinations": {}}')
    near = baselines.nearest(tmp_path, new_platform(), tmp_path / "x.json")
    assert near.path.name == "cpu-other-avx2-2c.json"
    assert len(near.skipped) == 1 and near.skipped[0].startswith("cpu-broken-avx2-2c.json: ")


def test_an_update_on_a_new_platform_prints_the_diff_against_the_nearest(tmp_path):
    platform_doc(tmp_path, "cpu", "Intel Xeon", "amx", 2, [CID], torch="2.12.0")
    new = new_platform("avx2")
    path = baselines.path_for(tmp_path, new["platform"]["id"])
    lines = baselines.nearest_lines(tmp_path, new, path, None)
    assert lines[0] == ("cpu-intel-xeon-avx2-2c.json is a new platform; nearest known platform: "
                        "cpu-intel-xeon-amx-2c.json (same device (cpu), other capability class (amx there, avx2 here), "
                        "same CPU model (Intel Xeon), same core count (2), 1 of 2 combinations in common)")
    assert "  software: torch 2.12.0 -> 2.13.0" in lines
    assert "  new measurements against cpu-intel-xeon-amx-2c.json:" in lines
    assert any(line.startswith(f"    ~ {CID}: ") and "speedup 2x -> 2.5x (+25.0%)" in line for line in lines)
    assert any(line.startswith("    + tiny+lookup:fp32:cpu:greedy:k3: ") for line in lines)
    assert baselines.nearest_lines(tmp_path / "empty", new, path, None) == [
        f"cpu-intel-xeon-avx2-2c.json is a new platform; no other baseline in {tmp_path / 'empty'} to compare with"]


@pytest.mark.parametrize("cpu_class", capability.CLASSES)
def test_every_combination_the_registry_makes_can_be_stored(tmp_path, cpu_class):
    """`--perf-update-baselines` writes a record under each combination's id, drafting suffixes
    (:fused, :c0.6, :lookupN, :vN, :attn-NAME) included: the schema must take every id the packaged
    registry resolves, on every CPU class, or an update measures for many minutes and then cannot write."""
    ids = [c.id for c in combinations.combinations(registry.load_matrix(cpu_class=cpu_class))]
    doc = valid_doc()
    doc["combinations"] = {cid: record() for cid in ids}
    baselines.write(baselines.path_for(tmp_path, PID), doc)
    assert sorted(baselines.load(baselines.path_for(tmp_path, PID))["combinations"]) == sorted(ids)
