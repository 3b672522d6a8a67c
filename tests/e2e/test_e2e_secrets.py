"""No secret on a command line: every local user can read every process's arguments (``ps``), so the
database password reaches accounting through its environment (``/proc/<pid>/environ`` is its owner's only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.cli.local_cluster import LocalCluster

pytestmark = pytest.mark.e2e


def test_no_process_of_the_cluster_has_the_database_password_on_its_command_line(
    local_cluster: LocalCluster,
) -> None:
    assert local_cluster.postgres is not None
    password = local_cluster.postgres.password
    assert len(password) >= 16
    pids = [p.proc.pid for p in local_cluster.processes if p.proc is not None and p.proc.poll() is None]
    assert pids and local_cluster.postgres.pid is not None
    for pid in [*pids, local_cluster.postgres.pid]:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        assert password not in cmdline, f"pid {pid}: {cmdline[:200]}"
    # Accounting still reaches the database: it has it in its environment, and sacct answers.
    (accounting,) = [p for p in local_cluster.processes if p.name == "accounting"]
    assert accounting.proc is not None
    environ = Path(f"/proc/{accounting.proc.pid}/environ").read_bytes().split(b"\0")
    assert any(v.startswith(b"CORRAL_DATABASE_URL=") and password.encode() in v for v in environ)
    assert oct(Path(f"/proc/{accounting.proc.pid}/environ").stat().st_mode & 0o777) == "0o400"
