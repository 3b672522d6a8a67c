"""Advance reservations end to end: an admin reserves a node for a user; outsiders stay off it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from e2e_cli import Cli, admin_cli

from corral.cli.local_cluster import LocalCluster

pytestmark = pytest.mark.e2e

JOB = "#!/bin/sh\n#SBATCH --gres=gpu:4 -t 1:00\nsleep 4\n"


def squeue(cli: Cli, job: int) -> str:
    return cli("squeue", "-h", "-j", str(job), "-o", "%T %r %N").stdout.strip()


def test_a_reserved_node_is_for_its_users_jobs_only(
    cli: Cli, local_cluster: LocalCluster, wait_for: Callable[[Callable[[], bool], float], None]
) -> None:
    assert local_cluster.config is not None
    free_node, reserved = (n.name for n in local_cluster.config.nodes)
    admin = admin_cli(cli, local_cluster)
    create = [
        "scontrol", "create", "reservation", "ReservationName=e2e", "StartTime=now", "Duration=10:00",
        f"Nodes={reserved}", f"Users={local_cluster.user}",
    ]  # fmt: skip
    # Only an admin may reserve; nothing is appended otherwise.
    denied = cli(*create)
    assert denied.returncode == 1 and "Access/permission denied" in denied.stderr, denied
    made = admin(*create)
    assert made.returncode == 0 and made.stdout.strip() == "Reservation e2e created", made
    try:
        again = admin(*create)
        assert again.returncode == 1 and "Duplicate reservation name" in again.stderr, again
        shown = cli("scontrol", "show", "reservation", "e2e").stdout
        assert f"Nodes={reserved} NodeCnt=1" in shown and "State=ACTIVE" in shown, shown
        assert f"Users={local_cluster.user} " in shown, shown
        sinfo = cli("sinfo", "-N", "-h", "-o", "%N %t").stdout.split("\n")
        assert f"{reserved} resv" in sinfo, sinfo

        # Outsiders: both land on the free node, one after the other, never on the reserved one.
        first = cli.sbatch(JOB)
        second = cli.sbatch(JOB)
        cli.wait_state(first, ("RUNNING", "COMPLETED"))
        wait_for(lambda: squeue(cli, second).startswith("PENDING Resources"), 15.0)
        # A member's job asks for the reservation and runs there at once.
        member = cli.sbatch(JOB, "--reservation=e2e")
        assert cli.wait_state(member, ("COMPLETED",)) == "COMPLETED|0:0"
        # The admin is not in Users=: refused at submit.
        refused = admin("sbatch", "--reservation=e2e", "--wrap", "true")
        assert refused.returncode == 1 and "Access denied to requested reservation" in refused.stderr
        for job in (first, second):
            assert cli.wait_state(job, ("COMPLETED",)) == "COMPLETED|0:0"
        nodes = {
            int(row.split("|")[0]): row.split("|")[1]
            for row in cli(
                "sacct", "-X", "-P", "-n", "-o", "JobID,NodeList", "-j", f"{first},{second},{member}"
            )
            .stdout.strip()
            .splitlines()
        }
        assert nodes == {first: free_node, second: free_node, member: reserved}, nodes
    finally:
        deleted = admin("scontrol", "delete", "ReservationName=e2e")
    assert deleted.returncode == 0, deleted
    assert cli("scontrol", "show", "reservation").stdout.strip() == "No reservations in the system"
    gone = admin("scontrol", "delete", "ReservationName=e2e")
    assert gone.returncode == 1 and "Requested reservation is invalid" in gone.stderr, gone
