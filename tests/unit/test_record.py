"""The result record has one source, harness/measure/record.py: the results JSON schema and the
table's columns must agree with its dataclasses field by field (a field added in one place and
not the other fails here)."""

from __future__ import annotations

import dataclasses
import json
import types
import typing

import pytest

from harness.measure import record
from harness.workload.registry import PACKAGE_DIR

SCHEMA = json.loads((PACKAGE_DIR / "schemas" / "bench-results.schema.json").read_text())
# the reference's columns, in its order, then the suite's own
REFERENCE_COLUMNS = ["Example#", "Prompt Length (tokens)", "New Tokens Generated", "Total Time (s)",
                     "Prefill Phase (ms)", "Time/Token (ms)", "Tokens/Sec", "Accepted/Drafted",
                     "Mean Accepted Length", "Target Forwards", "Speedup", "vs Reference"]


def resolve(node: dict) -> dict:
    while "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[1]]
    return node


def schema_allows_null(node: dict) -> bool:
    node = resolve(node)
    if "oneOf" in node:
        return any(schema_allows_null(n) for n in node["oneOf"])
    kind = node.get("type")
    return kind == "null" or (isinstance(kind, list) and "null" in kind)


def nullable(cls: type, name: str) -> bool:
    hint = typing.get_type_hints(cls)[name]
    return type(None) in typing.get_args(hint) if isinstance(hint, types.UnionType) else False


@pytest.mark.parametrize("cls, definition, leave_out", [
    (record.Row, "row", set()),
    (record.Summary, "summary", set()),
    (record.GenerationResult, "sample", {"mode"}),  # a sample sits in a row, which says the mode
])
def test_schema_holds_exactly_the_dataclass_fields(cls, definition, leave_out):
    names = {f.name for f in dataclasses.fields(cls)} - leave_out
    d = SCHEMA["$defs"][definition]
    assert set(d["properties"]) == names, f"schema {definition} vs {cls.__name__}"
    assert set(d["required"]) == names
    assert d["additionalProperties"] is False
    for name in names:
        assert schema_allows_null(d["properties"][name]) == nullable(cls, name), f"{cls.__name__}.{name}: null"


def test_columns_come_from_the_row_fields_in_the_reference_order():
    assert [c.header for c in record.COLUMNS] == REFERENCE_COLUMNS
    row_fields = {f.name for f in dataclasses.fields(record.Row)}
    assert all(c.key in row_fields and (c.over is None or c.over in row_fields) for c in record.COLUMNS)


def test_cells_format_values_and_missing_ones():
    row = record.Row(example=1, prompt_id="p", configuration="assisted k=6", mode="assisted", k=6, prompt_tokens=12,
                     new_tokens=64, total_s=3.21, prefill_ms=123.45, time_per_token_ms=45.67, tokens_per_sec=21.9,
                     cpu_s=6.0, target_forwards=20, drafted=90, accepted=44, mean_accepted_length=3.2, speedup=2.345,
                     same_tokens_as_plain=True)
    cells = {c.header: c.cell(row) for c in record.COLUMNS}
    assert cells["Accepted/Drafted"] == "44/90"
    assert cells["Speedup"] == "2.35x" and cells["Total Time (s)"] == "3.21" and cells["Prefill Phase (ms)"] == "123.5"
    plain = dataclasses.replace(row, drafted=None, accepted=None, speedup=None, mean_accepted_length=None)
    assert {c.header: c.cell(plain) for c in record.COLUMNS}["Accepted/Drafted"] == "-"


def test_a_generation_result_is_a_valid_sample():
    import jsonschema

    result = record.GenerationResult(mode="assisted", prompt_tokens=5, new_tokens=3, total_s=0.5, prefill_ms=10.0,
                                     time_per_token_ms=2.0, tokens_per_sec=500.0, cpu_s=0.9, target_forwards=2,
                                     drafted=4, accepted=1, mean_accepted_length=1.5, accepted_per_step=[1, 0],
                                     drafted_per_step=[2, 2], tokens=[1, 2, 3])
    validator = jsonschema.Draft202012Validator({"$defs": SCHEMA["$defs"], "$ref": "#/$defs/sample"})
    validator.validate(result.sample())
    assert "mode" not in result.sample()
