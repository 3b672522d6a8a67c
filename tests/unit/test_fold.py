"""The fold of the log into the scheduler's state: job and node lifecycles, and the fold's guards."""

from __future__ import annotations

import msgspec
import pytest
from builders import (
    Log,
    allocated,
    cluster,
    env,
    exited,
    job,
    node_name,
    numbered,
    registered,
    semantic,
    submitted,
)

from corral.libs.core.fold import apply, fold
from corral.libs.core.reasons import end_text
from corral.libs.core.state import Orphan, RunExit, decode_state, encode_state
from corral.schemas import events as ev
from corral.schemas.slim import SlimJobSpec

pytestmark = pytest.mark.unit

EIGHT = list(range(8))


def running(nodes: int = 1, gpus: list[int] | None = None) -> Log:
    """A log of a 4-node cluster where job 1 runs attempt 0 on gpu01..gpuNN with ``gpus`` on each."""
    log = Log(*cluster(nodes=4))
    held = EIGHT if gpus is None else gpus
    log.add(submitted(1, job(gpus=len(held), nodes=nodes)))
    log.add(allocated(1, {node_name(i): held for i in range(1, nodes + 1)}, cpus=2, mem_mb=1000))
    return log


def test_submit_makes_a_pending_job() -> None:
    log = Log()
    state = log.add(submitted(7, job(gpus=4, nodes=2), user="bob"))
    j = state.jobs[7]
    assert (j.state, j.user, j.restart_count, j.submit_time) == ("PENDING", "bob", 0, log.at)
    # The state keeps the spec without the script and environment; the submission's entry has them.
    slim = msgspec.structs.asdict(job(gpus=4, nodes=2)) | {"script": "", "environment": {}}
    assert msgspec.structs.asdict(j.spec) == slim and type(j.spec) is SlimJobSpec
    assert j.submit_seq == 1


def test_a_second_submit_of_the_same_id_changes_nothing() -> None:
    log = Log()
    log.add(submitted(7, job(nodes=1)))
    before = semantic(log.state)
    log.add(submitted(7, job(nodes=3), user="mallory"))
    assert semantic(log.state) == before


def test_allocation_runs_the_job_and_takes_node_capacity() -> None:
    log = running(nodes=2, gpus=[0, 1, 2])
    j = log.state.jobs[1]
    assert (j.state, j.partition, j.time_limit_s, j.start_time) == ("RUNNING", "gpu", 3600, log.at)
    assert [a.node for a in j.allocations] == ["gpu01", "gpu02"]
    for name in ("gpu01", "gpu02"):
        node = log.state.nodes[name]
        assert (node.used_gpus, node.alloc_cpus, node.alloc_mem_mb, node.jobs) == ([0, 1, 2], 2, 1000, [1])
    untouched = log.state.nodes["gpu03"]
    assert (untouched.used_gpus, untouched.alloc_cpus, untouched.jobs) == ([], 0, [])


def test_run_started_and_exited_are_recorded_for_the_current_run() -> None:
    log = running()
    log.add(ev.RunStarted(job_id=1, attempt=0, node="gpu01", pid=4242))
    assert log.state.jobs[1].run_started
    log.add(exited(1, "gpu01", exit_code=3, signal=0))
    j = log.state.jobs[1]
    assert j.state == "RUNNING"  # only the scheduler's conclusion ends it
    assert j.run_exit == RunExit(exit_code=3, signal=0, oom=False, timed_out=False, launch_error=None)


CONCLUSIONS = [
    (exited(1, "gpu01"), ev.JobCompleted(job_id=1, attempt=0), "COMPLETED", 0, 0, "", "completed"),
    (
        exited(1, "gpu01", exit_code=3),
        ev.JobFailed(job_id=1, attempt=0, reason="NonZeroExitCode", exit_code=3),
        "FAILED",
        3,
        0,
        "NonZeroExitCode",
        "failed keeps exit code",
    ),
    (
        exited(1, "gpu01", signal=9),
        ev.JobFailed(job_id=1, attempt=0, reason="RaisedSignal", signal=9),
        "FAILED",
        0,
        9,
        "RaisedSignal",
        "signal",
    ),
    (
        exited(1, "gpu01", signal=15, timed_out=True),
        ev.JobFailed(job_id=1, attempt=0, reason="TimeLimit", signal=15),
        "TIMEOUT",
        0,
        15,
        "TimeLimit",
        "timeout",
    ),
    (
        exited(1, "gpu01", signal=9, oom=True),
        ev.JobFailed(job_id=1, attempt=0, reason="OutOfMemory", signal=9),
        "OUT_OF_MEMORY",
        0,
        9,
        "OutOfMemory",
        "oom",
    ),
    (
        exited(1, "gpu01", signal=9, killed=True),
        ev.JobFailed(job_id=1, attempt=0, reason="NodeFail", signal=9),
        "NODE_FAIL",
        0,
        9,
        "NodeFail",
        "node fail",
    ),
    (
        exited(1, "gpu01", exit_code=1, launch_error="no such directory"),
        ev.JobFailed(job_id=1, attempt=0, reason="LaunchFailed", exit_code=1, message="no such directory"),
        "FAILED",
        1,
        0,
        "LaunchFailed",
        "launch failed",
    ),
]


@pytest.mark.parametrize(
    ("fact", "conclusion", "final", "exit_code", "signal", "end_reason"),
    [c[:6] for c in CONCLUSIONS],
    ids=[c[6] for c in CONCLUSIONS],
)
def test_conclusion_ends_the_job_and_frees_its_nodes(
    fact: ev.RunExited, conclusion: ev.Event, final: str, exit_code: int, signal: int, end_reason: str
) -> None:
    log = running(nodes=2)
    log.add(fact, conclusion)
    j = log.state.jobs[1]
    assert (j.state, j.exit_code, j.signal, j.end_reason) == (final, exit_code, signal, end_reason)
    assert j.end_time == log.at
    batch, peer = log.state.nodes["gpu01"], log.state.nodes["gpu02"]
    assert (batch.used_gpus, batch.alloc_cpus, batch.alloc_mem_mb, batch.jobs) == ([], 0, 0, [])
    # The peer may still run the job's processes (srun's tasks): it is held until its agent says they are
    # gone (Slurm's COMPLETING), though the job is no longer on it.
    assert [(o.job_id, o.attempt, o.node) for o in log.state.orphans] == [(1, 0, "gpu02")]
    assert peer.jobs == [] and peer.used_gpus != []
    log.add(exited(1, "gpu02", signal=15, killed=True))
    assert (peer.used_gpus, peer.alloc_cpus, peer.alloc_mem_mb, peer.jobs) == ([], 0, 0, [])
    assert log.state.orphans == []
    assert (j.state, j.exit_code, j.signal) == (final, exit_code, signal)  # the peer's report changes nothing


def test_a_failed_job_s_reason_names_what_failed() -> None:
    error = "cannot open output file /w/afile/1.out: /w/afile is not a directory"
    log = running(nodes=2)
    log.add(
        exited(1, "gpu01", exit_code=1, launch_error=error),
        ev.JobFailed(job_id=1, attempt=0, reason="LaunchFailed", exit_code=1, message=error),
    )
    assert end_text(log.state.jobs[1]) == f"LaunchFailed, {error}"
    done = running(nodes=2)
    done.add(exited(1, "gpu01"), ev.JobCompleted(job_id=1, attempt=0))
    assert end_text(done.state.jobs[1]) == "None"


def test_a_peer_that_reported_before_the_conclusion_is_free_at_the_conclusion() -> None:
    log = running(nodes=2)
    log.add(
        exited(1, "gpu02", signal=15, killed=True), exited(1, "gpu01"), ev.JobCompleted(job_id=1, attempt=0)
    )
    assert log.state.orphans == []
    assert all(n.used_gpus == [] for n in log.state.nodes.values())


def test_a_conclusion_is_final() -> None:
    log = running()
    log.add(exited(1, "gpu01"), ev.JobCompleted(job_id=1, attempt=0))
    before = semantic(log.state)
    log.add(
        ev.JobFailed(job_id=1, attempt=0, reason="NodeFail"),
        ev.JobRequeued(job_id=1, attempt=0, reason="Requested"),
        ev.JobCancelRequested(job_id=1, user="alice"),
        allocated(1, {"gpu02": [0]}, attempt=0),
    )
    assert semantic(log.state) == before


def test_cancel_of_a_pending_job() -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1), ev.JobCancelRequested(job_id=1, user="alice"))
    assert (log.state.jobs[1].state, log.state.jobs[1].cancel_by) == ("PENDING", "alice")
    # A decision made before the cancel was seen must not start it.
    log.add(allocated(1, {"gpu01": EIGHT}))
    assert log.state.jobs[1].state == "PENDING"
    assert log.state.nodes["gpu01"].used_gpus == []
    log.add(ev.JobCancelled(job_id=1, attempt=-1, by="alice", signal=0))
    j = log.state.jobs[1]
    assert (j.state, j.cancel_by, j.signal, j.end_time) == ("CANCELLED", "alice", 0, log.at)


def test_cancel_of_a_running_job_waits_for_the_run_to_exit() -> None:
    log = running()
    log.add(ev.JobCancelRequested(job_id=1, user="root"))
    j = log.state.jobs[1]
    assert (j.state, j.cancel_by) == ("RUNNING", "root")
    assert log.state.nodes["gpu01"].used_gpus == EIGHT
    log.add(ev.JobCancelRequested(job_id=1, user="alice"))
    assert j.cancel_by == "root"  # the first request names the canceller
    log.add(exited(1, "gpu01", signal=15, killed=True))
    assert j.state == "RUNNING"
    log.add(ev.JobCancelled(job_id=1, attempt=0, by="root", signal=15))
    assert (j.state, j.signal) == ("CANCELLED", 15)
    assert log.state.nodes["gpu01"].used_gpus == []


def test_requeue_releases_the_run_and_counts_a_restart() -> None:
    log = running(nodes=2)
    log.add(
        exited(1, "gpu01", signal=9, killed=True),
        exited(1, "gpu02", signal=9, killed=True),
        ev.JobRequeued(job_id=1, attempt=0, reason="NodeFail"),
    )
    j = log.state.jobs[1]
    assert (j.state, j.restart_count, j.allocations, j.run_exit, j.start_time) == (
        "PENDING",
        1,
        (),
        None,
        None,
    )
    assert all(n.used_gpus == [] and n.alloc_cpus == 0 and n.jobs == [] for n in log.state.nodes.values())
    # The old attempt can no longer be allocated; the next one can.
    log.add(allocated(1, {"gpu03": EIGHT}, attempt=0))
    assert j.state == "PENDING"
    log.add(allocated(1, {"gpu03": EIGHT}, attempt=1))
    assert (j.state, [a.node for a in j.allocations]) == ("RUNNING", ["gpu03"])


def requeued_and_rerun() -> Log:
    """Job 1 ran attempt 0 on gpu01, was requeued, and runs attempt 1 on gpu02 (started)."""
    log = running()
    log.add(exited(1, "gpu01", killed=True), ev.JobRequeued(job_id=1, attempt=0, reason="NodeFail"))
    log.add(allocated(1, {"gpu02": EIGHT}, attempt=1))
    log.add(ev.RunStarted(job_id=1, attempt=1, node="gpu02", pid=10))
    return log


STALE_FACTS = [
    (ev.RunStarted(job_id=1, attempt=0, node="gpu01", pid=9), "run started of the old attempt"),
    (exited(1, "gpu01", attempt=0, exit_code=1), "run exited of the old attempt"),
    (exited(1, "gpu01", attempt=1, exit_code=1), "run exited from a node that is not the batch node"),
    (ev.JobCompleted(job_id=1, attempt=0), "completed for the old attempt"),
    (ev.JobFailed(job_id=1, attempt=0, reason="NodeFail"), "failed for the old attempt"),
    (ev.JobCancelled(job_id=1, attempt=0, by="alice"), "cancelled for the old attempt"),
    (ev.JobRequeued(job_id=1, attempt=0, reason="NodeFail"), "requeued for the old attempt"),
    (ev.JobCancelled(job_id=1, attempt=-1, by="alice"), "cancelled as pending while running"),
    (allocated(1, {"gpu03": [0]}, attempt=1), "second allocation of the running attempt"),
    (exited(99, "gpu02"), "run exited of an unknown job"),
    (ev.NodeDown(node="nope", reason="x"), "down of an unknown node"),
]


@pytest.mark.parametrize("fact", [c[0] for c in STALE_FACTS], ids=[c[1] for c in STALE_FACTS])
def test_facts_for_a_stale_attempt_change_nothing(fact: ev.Event) -> None:
    log = requeued_and_rerun()
    before = semantic(log.state)
    log.add(fact)
    assert semantic(log.state) == before


BAD_ALLOCATIONS = [
    (allocated(2, {"gpu01": [3, 4]}), "GPU index held by another run"),
    (allocated(2, {"gpu02": [0], "gpu01": [3]}), "one node of several is taken"),
    (allocated(2, {"gpu02": [8]}), "GPU index beyond the node"),
    (allocated(2, {"gpu02": [-1]}), "negative GPU index"),
    (allocated(2, {"gpu01": [4]}, cpus=63), "more CPUs than free"),
    (allocated(2, {"gpu02": [0]}, mem_mb=600_000), "more memory than the node"),
    (allocated(2, {"gpu99": [0]}), "unregistered node"),
    (allocated(2, {}), "no nodes"),
]


@pytest.mark.parametrize("decision", [c[0] for c in BAD_ALLOCATIONS], ids=[c[1] for c in BAD_ALLOCATIONS])
def test_an_allocation_that_does_not_fit_is_ignored(decision: ev.JobAllocated) -> None:
    log = running(gpus=[0, 1, 2, 3])  # job 1 holds gpu01 GPUs 0-3 and 2 CPUs
    log.add(submitted(2, job(gpus=1, nodes=1)))
    before = semantic(log.state)
    log.add(decision)
    assert semantic(log.state) == before
    assert log.state.jobs[2].state == "PENDING"


def test_an_allocation_on_a_down_node_is_ignored() -> None:
    log = Log(*cluster(nodes=2))
    log.add(submitted(1), ev.NodeDown(node="gpu02", reason="Not responding"))
    log.add(allocated(1, {"gpu02": EIGHT}))
    assert log.state.jobs[1].state == "PENDING"
    assert log.state.nodes["gpu02"].used_gpus == []


DUPLICATED = [
    (allocated(1, {"gpu01": [0, 0]}), "same index twice on one node"),
    (
        ev.JobAllocated(
            job_id=1,
            attempt=0,
            partition="gpu",
            allocations=[
                ev.NodeAllocation(node="gpu01", gpus=[0]),
                ev.NodeAllocation(node="gpu01", gpus=[0]),
            ],
            time_limit_s=None,
        ),
        "same node twice",
    ),
]


@pytest.mark.parametrize("decision", [c[0] for c in DUPLICATED], ids=[c[1] for c in DUPLICATED])
def test_an_allocation_that_lists_a_gpu_twice_is_ignored(decision: ev.JobAllocated) -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(gpus=1, nodes=1)))
    log.add(decision)
    assert log.state.jobs[1].state == "PENDING"
    assert log.state.nodes["gpu01"].used_gpus == []


def test_a_decision_from_an_older_epoch_is_ignored() -> None:
    log = Log(*cluster(nodes=2))
    log.add(submitted(1), submitted(2))
    log.add(allocated(1, {"gpu01": EIGHT}, epoch=3))
    assert (log.state.epoch, log.state.jobs[1].state) == (3, "RUNNING")
    before = semantic(log.state)
    log.add(allocated(2, {"gpu02": EIGHT}, epoch=2))
    assert semantic(log.state) == before
    log.add(allocated(2, {"gpu02": EIGHT}, epoch=3))
    assert log.state.jobs[2].state == "RUNNING"


def test_entries_at_or_below_last_seq_are_ignored() -> None:
    log = running(nodes=2)
    log.add(exited(1, "gpu01"), ev.JobCompleted(job_id=1, attempt=0))
    once = encode_state(log.state)
    # Replaying the whole log, or any old entry, into the same state changes nothing.
    fold(log.entries, log.state)
    apply(log.state, 3, env(submitted(3)))
    assert encode_state(log.state) == once
    assert encode_state(fold(log.entries)) == once


def test_encode_state_round_trips() -> None:
    state = running(nodes=2).state
    state.orphans.append(Orphan(job_id=1, attempt=0, node="gpu01"))
    assert encode_state(decode_state(encode_state(state))) == encode_state(state)


def test_node_down_and_up() -> None:
    log = Log(*cluster(nodes=2))
    log.add(ev.NodeDown(node="gpu02", reason="Not responding"))
    node = log.state.nodes["gpu02"]
    assert (node.up, node.reason) == (False, "Not responding")
    assert log.state.nodes["gpu01"].up
    log.add(ev.NodeUp(node="gpu02"))
    assert (node.up, node.reason) == (True, "")


def test_node_down_keeps_its_runs_until_the_scheduler_concludes() -> None:
    log = running()
    log.add(ev.NodeDown(node="gpu01", reason="Not responding"))
    assert log.state.jobs[1].state == "RUNNING"
    assert log.state.nodes["gpu01"].used_gpus == EIGHT


def test_registration_again_updates_inventory_and_keeps_usage() -> None:
    log = running(gpus=[0, 1])
    log.add(ev.NodeDown(node="gpu01", reason="Not responding"))
    log.add(registered("gpu01", gpus=8, cpus=128, partitions=("gpu", "debug")))
    node = log.state.nodes["gpu01"]
    assert (node.up, node.cpus, node.partitions, node.used_gpus, node.jobs) == (
        True,
        128,
        ["gpu", "debug"],
        [0, 1],
        [1],
    )


def lost_peer(conclusion: ev.Event) -> Log:
    """Job 1 runs on gpu01 (batch) and gpu02; gpu02 goes down and the run is concluded."""
    log = running(nodes=2)
    log.add(ev.NodeDown(node="gpu02", reason="Not responding"), conclusion)
    return log


@pytest.mark.parametrize(
    "conclusion",
    [
        ev.JobRequeued(job_id=1, attempt=0, reason="NodeFail"),
        ev.JobFailed(job_id=1, attempt=0, reason="NodeFail"),
    ],
    ids=["requeued", "node fail"],
)
def test_a_concluded_run_is_an_orphan_on_each_node_until_that_node_reports_it_gone(
    conclusion: ev.Event,
) -> None:
    log = lost_peer(conclusion)
    # Both nodes: the batch node's script was not seen to exit, and the down peer's agent may have died
    # with its tasks still running (Slurm's COMPLETING, node by node).
    assert sorted((o.job_id, o.attempt, o.node) for o in log.state.orphans) == [
        (1, 0, "gpu01"),
        (1, 0, "gpu02"),
    ]
    for name in ("gpu01", "gpu02"):
        assert log.state.nodes[name].used_gpus != []
    log.add(exited(1, "gpu02", signal=9, killed=True))
    assert [o.node for o in log.state.orphans] == ["gpu01"]  # each node's own report counts for it
    assert log.state.nodes["gpu02"].used_gpus == []
    log.add(exited(1, "gpu01", signal=15, killed=True))
    assert log.state.orphans == []
    assert log.state.nodes["gpu01"].used_gpus == []
    assert log.state.nodes["gpu01"].alloc_cpus == 0


def test_an_orphan_outlives_its_node_going_down_and_coming_back() -> None:
    """A node is down when its agent is silent; the agent's death leaves the job's processes running. The
    GPUs stay held until the node's agent, back, reports the old run's processes gone."""
    log = lost_peer(ev.JobRequeued(job_id=1, attempt=0, reason="NodeFail"))
    log.add(ev.NodeDown(node="gpu01", reason="Not responding"))
    assert {o.node for o in log.state.orphans} == {"gpu01", "gpu02"}
    log.add(registered("gpu02"), registered("gpu01"))
    assert {o.node for o in log.state.orphans} == {"gpu01", "gpu02"}
    assert log.state.nodes["gpu02"].used_gpus != []


def test_a_down_batch_node_keeps_an_orphan_too() -> None:
    log = running(nodes=2)
    log.add(ev.NodeDown(node="gpu01", reason="Not responding"))
    log.add(ev.JobRequeued(job_id=1, attempt=0, reason="NodeFail"))
    assert {o.node for o in log.state.orphans} == {"gpu01", "gpu02"}


def test_fold_uses_the_log_clock() -> None:
    entries = numbered([env(submitted(1), at=50.0), env(submitted(2), at=40.0)])
    state = fold(entries)
    assert (state.now, state.last_seq) == (50.0, 2)
    assert state.jobs[2].submit_time == 40.0
