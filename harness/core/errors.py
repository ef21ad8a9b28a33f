"""Errors a user can act on. The CLI prints their message on one line, without a traceback, and
exits with the status of its kind.

Every error is one of four kinds, by what the user does about it: BadInputError (fix the option,
file or registry entry), MissingModelError (fetch the model), UnsupportedHereError (this machine
cannot do it: run it where it can) and IntegrityError (stored data is damaged or of another version:
restore or regenerate it). Each kind has its own `exit_status`; a new error subclasses one of them
(tests/unit/test_errors.py checks)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class HarnessError(Exception):
    """Base class: the message says what is wrong and what to do. Raise one of the four kinds below;
    raised itself (a few sites not yet classified), it exits as bad input does."""

    exit_status = 2


class BadInputError(HarnessError):
    """The user's option, environment variable, input file or registry entry is wrong: fix it, as the
    message says, and run again. The status argparse gives a bad option too."""

    exit_status = 2


class MissingModelError(HarnessError):
    """A model the run needs is not on this machine: fetch it (the message gives the command), or,
    where it cannot be fetched here, bring it from a machine that can."""

    exit_status = 3


class UnsupportedHereError(HarnessError):
    """This machine, host or installed library cannot do what was asked (no kernel for the CPU, no
    device, no working sandbox, no git history, cores that cannot be pinned): run it where it can,
    or ask for something this machine supports."""

    exit_status = 4


class IntegrityError(HarnessError):
    """Stored data failed its checksum or schema, or was written by another version, machine or
    setting: restore or regenerate it (the message says how); the data is not used as it is."""

    exit_status = 5


KINDS = (BadInputError, MissingModelError, UnsupportedHereError, IntegrityError)


class UnknownNameError(BadInputError, KeyError):
    """A model, pair, prompt set or platform name that the registry does not have."""

    def __init__(self, kind: str, name: str, available: Iterable[str], where: str = "harness/matrix.toml"):
        self.kind, self.name = kind, name
        self.available = sorted(available)
        super().__init__(f"Unknown {kind} {name!r}.{did_you_mean(name, self.available)} "
                         f"Available: {', '.join(self.available)} (registry: {where})")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class RegistryError(BadInputError):
    """The registry file is malformed."""


class ModelNotFetchedError(MissingModelError):
    """A registered model is not in the local cache yet. `shipped`: it comes with the suite (pinned
    PyPI packages), so every machine can fetch it; a hub model may not be had here at all."""

    def __init__(self, message: str, *, shipped: bool = False):
        super().__init__(message)
        self.shipped = shipped


class ModelUnavailableError(MissingModelError):
    """A model cannot be obtained here (no hub, missing path, unsupported source)."""


class ResultsError(IntegrityError):
    """A results file failed validation, or was written by a newer harness."""


class QuantizationError(BadInputError):
    """A quantization method cannot take this model or setting (quant.QuantSettingsError, whose
    package does not depend on the harness, re-raised for the CLI's one-line errors)."""


def did_you_mean(name: str, available: Iterable[str]) -> str:
    """' Did you mean 'x'?' for the closest match, or '' when nothing is close."""
    close = difflib.get_close_matches(name, list(available), n=1, cutoff=0.5)
    if not close:
        lowered = name.lower()
        close = [a for a in available if lowered in a.lower() or a.lower() in lowered][:1]
    return f" Did you mean {close[0]!r}?" if close else ""
