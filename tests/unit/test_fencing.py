"""The leader-epoch fence: every scheduler decision (``lifecycle.DECISIONS``) of an epoch older than the
newest the fold has seen changes nothing, whatever its type; one of the current or a newer epoch applies.

``DECISION_OF`` holds one applicable decision per type; the coverage test fails for a decision type added
without one, so a new decision cannot escape the fence unnoticed.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest
from builders import T0, Log, allocated, cluster, env, exited, job, semantic, submitted

from corral.libs.core.fold import apply
from corral.libs.core.state import State, decode_state, encode_state
from corral.schemas import events as ev
from corral.schemas import lifecycle
from corral.schemas.codec import envelope
from corral.services.accounting.folded import Projector

#: The epoch of the leader whose allocation the base log holds.
EPOCH = 5

#: One decision per type that applies to ``base()``'s state, given its epoch.
DECISION_OF: dict[type[ev.Event], Callable[[int], ev.Event]] = {
    ev.JobAllocated: lambda e: allocated(2, {"gpu02": [4, 5, 6, 7]}, epoch=e),
    ev.JobCompleted: lambda e: ev.JobCompleted(job_id=1, attempt=0, epoch=e),
    ev.JobFailed: lambda e: ev.JobFailed(job_id=1, attempt=0, reason="NonZeroExitCode", epoch=e),
    ev.JobCancelled: lambda e: ev.JobCancelled(job_id=2, attempt=-1, by="alice", epoch=e),
    ev.JobRequeued: lambda e: ev.JobRequeued(job_id=1, attempt=0, reason="NodeFail", epoch=e),
    ev.JobHeld: lambda e: ev.JobHeld(job_id=2, by="alice", epoch=e),
    ev.JobReleased: lambda e: ev.JobReleased(job_id=3, by="alice", epoch=e),
    ev.JobUpdated: lambda e: ev.JobUpdated(job_id=2, by="alice", time_limit_s=60, partition="gpu", epoch=e),
    ev.JobPreempted: lambda e: ev.JobPreempted(job_id=4, attempt=0, mode="requeue", by_job=2, epoch=e),
    ev.JobReasonChanged: lambda e: ev.JobReasonChanged(job_id=2, attempt=0, reason="Resources", epoch=e),
    ev.ReservationCreated: lambda e: ev.ReservationCreated(
        name="maint", start_time=T0 + 3600, end_time=T0 + 7200, nodes=["gpu01"], epoch=e
    ),
    ev.ReservationRejected: lambda e: ev.ReservationRejected(name="maint", reason="busy", epoch=e),
    ev.ReservationDeleted: lambda e: ev.ReservationDeleted(name="old", by="root", epoch=e),
}


def base() -> State:
    """``base_log()``'s state."""
    return base_log().state


def base_log() -> Log:
    """Two nodes; job 1 ran on gpu01 and exited (to conclude), job 2 pending, job 3 held, job 4 running on
    half of gpu02 (to preempt); a reservation ``old`` and a request for ``maint``; the epoch is ``EPOCH``."""
    log = Log(*cluster(nodes=2))
    log.add(
        submitted(1),
        allocated(1, {"gpu01": list(range(8))}, epoch=EPOCH),
        exited(1, "gpu01", exit_code=1),
        submitted(2),
        submitted(3, job(nodes=1, held=True)),
        submitted(4, job(nodes=1, gpus=4)),
        allocated(4, {"gpu02": [0, 1, 2, 3]}, epoch=EPOCH),
        ev.ReservationCreated(name="old", start_time=T0 + 3600, end_time=T0 + 7200, nodes=["gpu02"]),
        ev.ReservationCreateRequested(
            name="maint", user="root", start_time=T0 + 3600, end_time=T0 + 7200, nodes=["gpu01"]
        ),
    )
    assert log.state.epoch == EPOCH
    return log


def copy(state: State) -> State:
    return decode_state(encode_state(state))


def unchanged(state: State) -> bytes:
    """``semantic`` without the reservations' subject sequences (a fenced entry moves its subject's)."""
    bare = copy(state)
    bare.resv_seqs = {}
    return semantic(bare)


def fold_one(state: State, body: ev.Event) -> str | None:
    """Fold ``body`` as the next entry; the reason it was ignored (None: applied)."""
    seq = state.last_seq + 1
    outcome = apply(state, seq, envelope(body, actor="scheduler", occurred_at=state.now + 1.0))
    return outcome.reason


def test_every_decision_type_has_a_fenced_case() -> None:
    assert set(DECISION_OF) == set(lifecycle.DECISIONS)
    assert {t for t, w in lifecycle.WRITERS.items() if w == "scheduler"} == lifecycle.DECISIONS


KINDS = sorted(lifecycle.DECISIONS, key=lambda t: t.__name__)


@pytest.mark.parametrize("kind", KINDS, ids=lambda t: t.__name__)
def test_every_decision_carries_an_epoch_that_old_logs_lack(kind: type[ev.Event]) -> None:
    fields = {f.name: f for f in msgspec.structs.fields(kind)}
    assert "epoch" in fields and fields["epoch"].default == 0
    # An entry written before epochs existed decodes with epoch 0.
    old = msgspec.json.decode(
        msgspec.json.encode(DECISION_OF[kind](7)).replace(b',"epoch":7', b""), type=kind
    )
    assert old.epoch == 0  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", KINDS, ids=lambda t: t.__name__)
def test_a_stale_epoch_changes_nothing_and_a_current_one_applies(kind: type[ev.Event]) -> None:
    make = DECISION_OF[kind]
    state = base()
    before = unchanged(state)
    assert fold_one(state, make(EPOCH - 1)) == "stale_epoch"
    assert unchanged(state) == before and state.epoch == EPOCH
    # The subject's sequence moves all the same: the next conditional append on it expects this entry.
    subject = getattr(make(0), "job_id", None)
    if subject is not None:
        assert state.jobs[subject].last_seq == state.last_seq
    else:
        name = make(0).name  # type: ignore[union-attr]
        assert state.resv_seqs[name] == state.last_seq
    # The same decision by the current leader applies; by a newer one, it also raises the epoch.
    assert fold_one(copy(base()), make(EPOCH)) is None
    newer = copy(base())
    assert fold_one(newer, make(EPOCH + 1)) is None and newer.epoch == EPOCH + 1


def test_the_first_decision_of_a_new_leader_fences_the_old_one_on_every_job() -> None:
    state = base()
    assert fold_one(state, ev.JobHeld(job_id=2, by="alice", epoch=EPOCH + 1)) is None
    # The deposed leader concludes job 1 and preempts job 4: neither counts.
    assert fold_one(state, ev.JobCompleted(job_id=1, attempt=0, epoch=EPOCH)) == "stale_epoch"
    assert fold_one(state, DECISION_OF[ev.JobPreempted](EPOCH)) == "stale_epoch"
    assert state.jobs[1].state == "RUNNING" and state.jobs[4].preempting is None


def test_accounting_records_nothing_of_a_deposed_leader() -> None:
    log = base_log()
    last = log.entries[-1][0]
    stale = env(ev.JobCompleted(job_id=1, attempt=0, epoch=EPOCH - 1), at=log.at + 1)
    current = env(
        ev.JobFailed(job_id=1, attempt=0, reason="NonZeroExitCode", exit_code=1, epoch=EPOCH), at=log.at + 2
    )
    projector = Projector("gpu")
    projector.operations([*log.entries, (last + 1, stale), (last + 2, current)])
    assert projector.pending[last + 1] == []
    assert projector.pending[last + 2] != []
