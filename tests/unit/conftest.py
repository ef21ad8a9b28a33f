import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # tiny_models helper


def pytest_report_header(config):
    """Which sandbox backend the hostile-completion tests meet on this machine (none: they fail, saying why)."""
    from harness.sandbox import execute as sandbox

    try:
        backend = sandbox.select_backend("auto")
    except sandbox.SandboxUnavailable as exc:
        return f"sandbox backend: none works here: {exc}"
    return f"sandbox backend: {backend} ({sandbox.backend_note(backend)})"
