"""A real PostgreSQL server for the history's tests: the system's own binaries (Debian's postgresql
package; `make postgres-tools` installs it), a throw-away cluster on loopback, started as an
unprivileged user (PostgreSQL refuses root) and killed with the test process even if that one is
SIGKILLed. Under CI a missing server fails the test; elsewhere it skips with what to install."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from waiting import wait_for

INSTALL = "PostgreSQL's server is not installed: `make postgres-tools` (Debian's postgresql package)"


def binaries() -> Path | None:
    """The newest /usr/lib/postgresql/N/bin holding initdb and postgres, else the PATH's."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parent.parent.name)
                   if p.parent.parent.name.isdigit() else 0)
    if found:
        return found[-1].parent
    postgres = shutil.which("postgres")
    return Path(postgres).parent if postgres and shutil.which("initdb") else None


def missing() -> None:
    """Fail under CI (the suite installs the server there), skip elsewhere."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{INSTALL}; under CI this test runs, never skips")
    pytest.skip(INSTALL)


def _as_user() -> list[str]:
    """A prefix that runs a command as an unprivileged user when we are root (the package's postgres user,
    else nobody), dying with this process."""
    prefix = ["setpriv", "--pdeathsig", "KILL"]
    if os.geteuid() != 0:
        return prefix + ["--"]
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            user = pwd.getpwnam(name)
            return prefix + ["--reuid", str(user.pw_uid), "--regid", str(user.pw_gid), "--clear-groups", "--"]
    raise RuntimeError("no unprivileged user to run PostgreSQL as")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server() -> Iterator[str]:
    """A running cluster; yields the URL of its `postgres` database (user harness, trust on loopback)."""
    bindir = binaries()
    if bindir is None:
        missing()
    home = Path(tempfile.mkdtemp(prefix="harness-pg-"))
    proc = None
    try:
        os.chmod(home, 0o755)
        prefix = _as_user()
        if os.geteuid() == 0:
            uid, gid = int(prefix[prefix.index("--reuid") + 1]), int(prefix[prefix.index("--regid") + 1])
            os.chown(home, uid, gid)
        subprocess.run(prefix + [str(bindir / "initdb"), "-D", str(home / "data"), "-U", "harness", "--auth=trust",
                                 "-E", "UTF8", "--no-instructions"], check=True, capture_output=True, timeout=120)
        port = free_port()
        proc = subprocess.Popen(prefix + [str(bindir / "postgres"), "-D", str(home / "data"), "-k", str(home),
                                          "-h", "127.0.0.1", "-p", str(port), "-c", "fsync=off"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"postgresql://harness@127.0.0.1:{port}/postgres"
        assert wait_for(lambda: proc.poll() is not None or _accepts(url), 60), "PostgreSQL did not start in 60 s"
        assert proc.poll() is None, f"PostgreSQL exited with {proc.returncode}"
        yield url
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # fast shutdown; killed if it lingers
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(home, ignore_errors=True)


def _accepts(url: str) -> bool:
    import psycopg

    try:
        psycopg.connect(url, connect_timeout=2).close()
        return True
    except psycopg.OperationalError:
        return False


def new_database(url: str) -> str:
    """A fresh empty database on the server: its URL."""
    import psycopg

    name = f"h_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as db:
        db.execute(f"CREATE DATABASE {name}")
    return url.rsplit("/", 1)[0] + "/" + name
