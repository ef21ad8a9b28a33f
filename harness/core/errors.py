"""Errors a user can act on. The CLI prints their message on one line, without a traceback."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class HarnessError(Exception):
    """Base class: the message says what is wrong and what to do."""


class UnknownNameError(HarnessError, KeyError):
    """A model, pair, prompt set or platform name that the registry does not have."""

    def __init__(self, kind: str, name: str, available: Iterable[str], where: str = "harness/matrix.toml"):
        self.kind, self.name = kind, name
        self.available = sorted(available)
        super().__init__(f"Unknown {kind} {name!r}.{did_you_mean(name, self.available)} "
                         f"Available: {', '.join(self.available)} (registry: {where})")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class RegistryError(HarnessError):
    """The registry file is malformed."""


class ModelNotFetchedError(HarnessError):
    """A registered model is not in the local cache yet. `shipped`: it comes with the suite (pinned
    PyPI packages), so every machine can fetch it; a hub model may not be had here at all."""

    def __init__(self, message: str, *, shipped: bool = False):
        super().__init__(message)
        self.shipped = shipped


class ModelUnavailableError(HarnessError):
    """A model cannot be obtained here (no hub, missing path, unsupported source)."""


class IntegrityError(HarnessError):
    """Downloaded or assembled data does not match its recorded checksum or size."""


class ResultsError(HarnessError):
    """A results file failed validation."""


class QuantizationError(HarnessError):
    """A quantization method cannot take this model or setting (quant.QuantSettingsError, whose
    package does not depend on the harness, re-raised for the CLI's one-line errors)."""


def did_you_mean(name: str, available: Iterable[str]) -> str:
    """' Did you mean 'x'?' for the closest match, or '' when nothing is close."""
    close = difflib.get_close_matches(name, list(available), n=1, cutoff=0.5)
    if not close:
        lowered = name.lower()
        close = [a for a in available if lowered in a.lower() or a.lower() in lowered][:1]
    return f" Did you mean {close[0]!r}?" if close else ""
