"""Admin drain, down and resume end to end: a drained node finishes its job and gets no new one until
resumed, a downed node's job is requeued and killed there, an agent restart keeps both, and only an admin
may drain (bad requests append nothing)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agent_cluster import agent_cluster, last_seq, wait_until
from e2e_cli import Cli, admin_cli, alive

from corral.cli.local_cluster import LocalCluster
from corral.libs.infra import roles
from corral.schemas import subjects

pytestmark = pytest.mark.e2e

#: A job that fills one node (2 GPUs each) for a few seconds.
JOB = "#!/bin/sh\n#SBATCH --gres=gpu:2 -t 1:00\nsleep {seconds}\n"
DRAIN = ["scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=e2e maintenance"]


@pytest.fixture(scope="module")
def drain_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Cli]]:
    """A 2-node cluster whose agents can be restarted without the nodes being marked down."""
    with agent_cluster(tmp_path_factory.mktemp("drain")) as pair:
        yield pair


def node_states(cli: Cli) -> dict[str, str]:
    rows = cli("sinfo", "-N", "-h", "-o", "%N %t").stdout.split("\n")
    return dict(row.split() for row in rows if row.strip())


def squeue(cli: Cli, job: int) -> str:
    return cli("squeue", "-h", "-j", str(job), "-o", "%T|%r").stdout.strip()


def node_of(cli: Cli, job: int) -> str:
    return cli.sacct(job, "NodeList")


def test_bad_and_unauthorised_requests_append_nothing(drain_cluster: tuple[LocalCluster, Cli]) -> None:
    cluster, cli = drain_cluster
    admin = admin_cli(cli, cluster)
    cases = [
        (cli, DRAIN, "Access/permission denied"),
        (admin, ["scontrol", "update", "NodeName=node9", "State=DRAIN", "Reason=x"], "Invalid node name"),
        (admin, ["scontrol", "update", "NodeName=node[1-", "State=DRAIN", "Reason=x"], "NodeName"),
        (admin, ["scontrol", "update", "NodeName=node2", "State=DRAIN"], "You must specify a reason"),
        (admin, ["scontrol", "update", "NodeName=node2", "State=bogus"], "Invalid input: State=bogus"),
        (admin, ["scontrol", "update", "NodeName=node2", "State=RESUME"], "Invalid node state specified"),
    ]
    for who, argv, message in cases:
        out = who(*argv)
        assert out.returncode == 1 and message in out.stderr and out.stdout == "", (argv, out)
        assert "Traceback" not in out.stderr
    for node in ("node1", "node2", "node9"):
        for tag in ("node_drain_requested", "node_resume_requested"):
            assert last_seq(cluster, subjects.node_subject(node, tag)) == 0
    assert node_states(cli) == {"node1": "idle", "node2": "idle"}


def test_a_drained_node_finishes_its_job_and_gets_no_new_one_until_resumed(
    drain_cluster: tuple[LocalCluster, Cli],
) -> None:
    cluster, cli = drain_cluster
    admin = admin_cli(cli, cluster)
    running = cli.sbatch(JOB.format(seconds=8), "-w", "node2")
    cli.wait_state(running, ("RUNNING",))

    drained = admin(*DRAIN)
    assert drained.returncode == 0 and drained.stdout == "", drained
    wait_until(lambda: node_states(cli).get("node2") == "drng", what="node2 draining")
    shown = cli("scontrol", "show", "node", "node2").stdout
    assert "State=ALLOCATED+DRAIN " in shown, shown
    assert f"Reason=e2e maintenance [{roles.ADMIN}@" in shown, shown

    # New jobs go to node1 only, one after the other; a job asking for node2 waits for it.
    first = cli.sbatch(JOB.format(seconds=2))
    second = cli.sbatch(JOB.format(seconds=2))
    pinned = cli.sbatch(JOB.format(seconds=1), "-w", "node2")
    wait_until(
        lambda: squeue(cli, pinned) == "PENDING|ReqNodeNotAvail, UnavailableNodes:node2",
        what="ReqNodeNotAvail",
    )
    assert cli.wait_state(running, ("COMPLETED", "FAILED")) == "COMPLETED|0:0"
    for job in (first, second):
        assert cli.wait_state(job, ("COMPLETED", "FAILED")) == "COMPLETED|0:0"
        assert node_of(cli, job) == "node1"
    wait_until(lambda: node_states(cli).get("node2") == "drain", what="node2 drained")
    reasons = cli("sinfo", "-R", "-h").stdout
    assert "e2e maintenance" in reasons and reasons.rstrip().endswith("node2"), reasons
    wide = cli("sinfo", "-R", "-h", "-o", "%E|%u|%N").stdout
    assert wide == f"e2e maintenance|{roles.ADMIN}|node2\n", wide

    # An agent restart (a clean re-registration) keeps the admin drain.
    registered = last_seq(cluster, subjects.node_subject("node2", "node_registered"))
    cluster.terminate("agent-node2")
    cluster.revive("agent-node2")
    wait_until(
        lambda: last_seq(cluster, subjects.node_subject("node2", "node_registered")) > registered,
        what="node2 registered again",
    )
    assert squeue(cli, pinned).startswith("PENDING|ReqNodeNotAvail")
    assert node_states(cli)["node2"] == "drain"

    # Resumed: the waiting job runs there, and node2 takes new jobs again.
    resumed = admin("scontrol", "update", "nodename=node2", "state=resume")
    assert resumed.returncode == 0, resumed
    assert cli.wait_state(pinned, ("COMPLETED", "FAILED")) == "COMPLETED|0:0"
    assert node_of(cli, pinned) == "node2"
    both = [cli.sbatch(JOB.format(seconds=4)) for _ in range(2)]
    for job in both:
        assert cli.wait_state(job, ("COMPLETED", "FAILED")) == "COMPLETED|0:0"
    assert sorted(node_of(cli, job) for job in both) == ["node1", "node2"]
    assert node_states(cli) == {"node1": "idle", "node2": "idle"}
    assert "e2e maintenance" not in cli("sinfo", "-R").stdout


#: Writes its pid, then runs long; its second run (after the requeue) ends at once.
REQUEUED = """#!/bin/bash
#SBATCH --gres=gpu:2 -t 5:00 -o down-%j.out --open-mode=append
echo "run $SLURM_RESTART_COUNT on $SLURMD_NODENAME"
[ "$SLURM_RESTART_COUNT" = 0 ] || exit 0
echo $$ > down-$SLURM_JOB_ID.pid
exec sleep 300
"""


def test_a_downed_node_requeues_its_job_kills_it_and_stays_down_until_resumed(
    drain_cluster: tuple[LocalCluster, Cli],
) -> None:
    cluster, cli = drain_cluster
    admin = admin_cli(cli, cluster)
    # node1 is busy, so the job starts on node2 (and may rerun anywhere).
    blocker = cli.sbatch(JOB.format(seconds=300), "-w", "node1")
    cli.wait_state(blocker, ("RUNNING",))
    job = cli.sbatch(REQUEUED)
    pid_file = cli.workdir / f"down-{job}.pid"
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip() != "", what="the job started")
    pid = int(pid_file.read_text())
    assert cli("scancel", str(blocker)).returncode == 0
    assert admin("scontrol", "update", "NodeName=node2", "State=DOWN").returncode == 1  # a reason is needed

    downed = admin("scontrol", "update", "NodeName=node2", "State=DOWN", "Reason=PSU swap")
    assert downed.returncode == 0 and downed.stdout == "", downed
    # Its job is requeued (the node is still there, so its process is killed through the agent) and
    # reruns on node1; node2 stays down while its agent heartbeats and after the agent restarts.
    wait_until(lambda: not alive(pid), what="the job's process on node2 killed")
    assert cli.wait_state(job, ("COMPLETED", "FAILED", "NODE_FAIL")) == "COMPLETED|0:0"
    assert (cli.workdir / f"down-{job}.out").read_text().splitlines() == ["run 0 on node2", "run 1 on node1"]
    assert node_states(cli)["node2"] == "down"
    shown = cli("scontrol", "show", "node", "node2").stdout
    assert "State=DOWN " in shown and f"Reason=PSU swap [{roles.ADMIN}@" in shown, shown
    cluster.terminate("agent-node2")
    cluster.revive("agent-node2")
    pinned = cli.sbatch(JOB.format(seconds=1), "-w", "node2")
    wait_until(lambda: squeue(cli, pinned).startswith("PENDING|ReqNodeNotAvail"), what="pinned job waits")
    assert node_states(cli)["node2"] == "down"

    assert admin("scontrol", "update", "NodeName=node2", "State=RESUME").returncode == 0
    assert cli.wait_state(pinned, ("COMPLETED", "FAILED")) == "COMPLETED|0:0"
    assert node_of(cli, pinned) == "node2"
    assert node_states(cli) == {"node1": "idle", "node2": "idle"}
