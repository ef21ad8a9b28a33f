"""A gate decided again from recorded rounds (`--perf-replay FILE`): the rounds an earlier run kept in
its results.json go through the same gate code as live ones, in the same order, so a recording
replayed at its own settings gives its own decisions, and at another tolerance or against other
baselines the verdict those would have given, without measuring anything.

An A/B entry replays both arms' rounds through the A/B gate (harness/perf/ab/gate.py) with
`RecordedArm`s in place of workers; a stored-gate entry replays its rounds against the current
baseline file through the stored gate (`RecordedRunner` in place of measuring). The statistical
design (looks, alpha) stays the settings'; the recording's length is the cap: a gate that would have
measured more ends there, undecided where it had not decided, as at a live cap.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core import jsonio
from harness.core.errors import BadInputError
from harness.perf.ab import duet
from harness.perf.ab.gate import ABGate, ABSettings
from harness.perf.ab.loadguard import LoadGuard
from harness.perf.ab.revision import Tree
from harness.perf.combinations import Combination, PerfSettings
from harness.perf.record import METRICS, Round, rounds_from
from harness.measure.phases import PhaseCost
from harness.perf.report import SCHEMA, SCHEMA_VERSION
from harness.perf.runner import Runner


class ReplayError(BadInputError):
    """A recording that cannot be replayed: unreadable, of another schema, or run dry."""


@dataclass(frozen=True)
class RecordedGate:
    """One combination's recorded rounds: the candidate's (or the stored gate's) and, for A/B, the base's."""
    combination: str
    gate: str                          # "ab" or "stored" (an update's rounds replay as the stored gate's)
    rounds: list[Round]
    base_rounds: list[Round] | None    # A/B only
    base: str | None                   # A/B: "<revision> <sha12>" of each arm
    candidate: str | None
    mode: str | None                   # A/B: "duet" or "interleaved"


def _rounds_with_null(*fields: str) -> Callable[[Any], Any]:
    """A result of the version before `fields` were added to its rounds (both arms'), given them as nulls."""
    def fill_rounds(rounds: Any) -> Any:
        if not isinstance(rounds, list):
            return rounds
        return [{**r, **dict.fromkeys(fields)} if isinstance(r, dict) else r for r in rounds]

    def fill(entry: Any) -> Any:
        if not isinstance(entry, dict):
            return entry
        entry = {**entry, "rounds": fill_rounds(entry.get("rounds"))}
        if isinstance(entry.get("ab"), dict):
            entry["ab"] = {**entry["ab"], "base_rounds": fill_rounds(entry["ab"].get("base_rounds"))}
        return entry
    return fill


def _with_null(field: str) -> Callable[[Any], Any]:
    """A result of the version before `field` was added to its A/B detail, given it as null."""
    def fill(entry: Any) -> Any:
        if isinstance(entry, dict) and isinstance(entry.get("ab"), dict):
            return {**entry, "ab": {**entry["ab"], field: None}}
        return entry
    return fill


def _each_result(upgrade: Callable[[Any], Any]) -> Callable[[dict], dict]:
    return lambda doc: {"results": [upgrade(r) for r in doc.get("results", [])]}


# version -> what a results.json of that version gains to read as the next one
_UPGRADES: dict[int, Callable[[dict], dict]] = {
    2: lambda doc: {"provenance": None},                # before results recorded where they came from
    3: _each_result(_rounds_with_null("phases", "acceptance_by_position")),  # before rounds recorded their phases
    4: _each_result(_with_null("environments")),        # before A/B results named the arms' environments
    5: _each_result(_with_null("swap_s")),              # before side-by-side arms exchanged cores within a round
    6: _each_result(_with_null("stand_in_rounds")),     # before the stand-in covered the arm that finished first
    7: _each_result(_with_null("synced_rounds")),       # before the arms could start each run of a round together
    8: _each_result(_rounds_with_null("page_faults")),  # before rounds counted their page faults
}


@dataclass(frozen=True)
class Recording:
    path: Path
    gates: dict[str, RecordedGate]

    @classmethod
    def load(cls, path: Path) -> "Recording":
        """A results.json written by a perf run; ReplayError naming the file when it is not one."""
        try:
            doc = jsonio.read_strict(path, ReplayError)
        except ReplayError as exc:
            raise ReplayError(f"--perf-replay {exc} (give the results.json of a perf run)") from None
        version = doc.get("schema_version") if isinstance(doc, dict) else None
        if type(version) is not int or version not in range(2, SCHEMA_VERSION + 1):
            raise ReplayError(f"--perf-replay {path}: schema_version {version!r}, this harness replays 2 to "
                              f"{SCHEMA_VERSION} (a results.json of an older harness has no rounds to replay)")
        for older in range(version, SCHEMA_VERSION):  # each step: the same rounds, given what the next version added
            doc = {**doc, "schema_version": older + 1, **_UPGRADES[older](doc)}
        jsonio.validate(doc, SCHEMA, f"--perf-replay {path}", ReplayError,
                        hint="give the results.json of a perf run of this harness version")
        gates = {}
        for entry in doc["results"]:
            cid, ab = entry["combination"], entry.get("ab")
            where = f"--perf-replay {path}: {cid}"
            gates[cid] = RecordedGate(
                cid, "ab" if ab else "stored", rounds_from(entry["rounds"], where),
                rounds_from(ab["base_rounds"], where + " base") if ab else None,
                ab["base"] if ab else None, ab["candidate"] if ab else None, ab["mode"] if ab else None)
        return cls(path, gates)

    def get(self, combination: str) -> RecordedGate | None:
        return self.gates.get(combination)


class RecordedArm:
    """An A/B arm that answers from recorded rounds instead of a worker (the Arm interface the gate uses)."""

    process = None  # nothing to pin, nothing for the load guard to watch
    environment = None  # no interpreter runs it: the recording's entry names the environments it ran in

    def __init__(self, name: str, described: str, rounds: list[Round]):
        revision, _, sha = described.rpartition(" ")
        self.name = name
        self.tree = Tree(Path("."), sha or described, f"replayed {revision or described}")
        self.rounds = deque(rounds)
        self.prompt_ids = sorted(rounds[0].counters) if rounds else []
        self._pending: deque[dict[str, Any]] = deque()

    @property
    def label(self) -> str:
        return f"{self.name} ({self.tree.label}, {self.tree.commit[:12]})"

    def start(self) -> None:
        pass

    def restart(self) -> None:
        pass

    def close(self, *, ask: bool = True) -> None:
        pass

    def send(self, message: dict[str, Any]) -> None:
        self._pending.append(message)

    def receive(self, op: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        message = self._pending.popleft()
        if message["op"] == "load":
            return {"ok": True, "prompt_ids": self.prompt_ids}
        if message["op"] == "round":
            if not self.rounds:
                raise ReplayError(f"{self.label}: the recording has no round {message['index'] + 1}")
            return {"ok": True, **self.rounds.popleft().to_json()}
        raise ReplayError(f"{self.label}: a recording cannot answer {message['op']!r}")

    def request(self, message: dict[str, Any], *, timeout_s: float | None = None) -> dict[str, Any]:
        self.send(message)
        return self.receive(message["op"], timeout_s=timeout_s)


def ab_gate(combo: Combination, settings: PerfSettings, ab: ABSettings, base: RecordedArm, candidate: RecordedArm,
            plan: duet.Plan | None = None) -> ABGate:
    """The A/B gate over two arms' recorded rounds: nothing to load, no load guard (nothing is
    measured, so nothing can be disturbed), the recording's length as its cap."""
    return ABGate(combo, settings, base, candidate, lambda arm: {"op": "load"}, ab, guard=LoadGuard(watch=False),
                  plan=plan, available=min(len(base.rounds), len(candidate.rounds)))


class RecordedRunner(Runner):
    """The stored gate's runner with recorded rounds instead of measured ones. It loads the target's
    tokenizer and the prompts, no model, so that the baseline's settings are checked as in a live run."""

    measures = False

    def __init__(self, combo: Combination, tokenizer: Any, settings: PerfSettings, *, recorded: list[Round]):
        super().__init__(combo, None, settings, tokenizer=tokenizer)
        self.recorded = deque(recorded)

    def warmup(self) -> None:
        pass

    def rounds_left(self) -> int:
        return min(super().rounds_left(), len(self.recorded))

    def round(self) -> Round:
        if not self.recorded:
            raise ReplayError(f"{self.combo.id}: the recording has no round {self.samples.rounds() + 1}")
        done = self.recorded.popleft()
        self.samples.add(done)
        return done


def power_row_rounds(row: dict[str, Any], arm: str) -> list[Round]:
    """One arm's rounds from a gate of benchmarks/ab_power.py's data: each round's metrics and,
    where the row kept them, its phases (what the gate decided on)."""
    values, kept = row["arms"][arm], (row.get("phases") or {}).get(arm)
    return [Round(**{m: values[m][i] for m in METRICS}, counters={},
                  phases=None if not kept or kept[i] is None else {p: PhaseCost.from_dict(c) for p, c in kept[i].items()})
            for i in range(row["rounds"])]


def power_row_phases(samples: dict[str, list[Round]]) -> dict[str, list[dict[str, Any] | None]]:
    """Each arm's rounds' phases as a row of benchmarks/ab_power.py's data keeps them."""
    return {arm: [None if r.phases is None else {p: dataclasses.asdict(c) for p, c in r.phases.items()} for r in rounds]
            for arm, rounds in samples.items()}  # unrounded: a replay sees what the live gate saw

