"""Advance reservations at the gateway: admins create and delete them; submit checks ``--reservation``.

``scontrol create reservation`` answers synchronously in Slurm ("Reservation X created" or "Error creating
the reservation: Requested nodes are busy"). Here the gateway checks the request against the
configuration, appends ``ReservationCreateRequested`` (or ``...DeleteRequested``) on
``corral.evt.resv.<name>.<tag>`` and then waits, bounded by ``ANSWER_TIMEOUT_S``, for the scheduler's
decision on that name's subjects (``ReservationCreated``/``Rejected``/``Deleted`` appended after the
intent). Without an answer in time the reply says so: the request stays in the log and the scheduler
still answers it, which ``scontrol show reservation`` shows.

The gateway holds no state: what a reservation is (for ``sbatch --reservation``) is read from the newest
``ReservationCreated`` and ``ReservationDeleted`` entries of its name.
"""

from __future__ import annotations

import math
from typing import cast, get_args

from corral.libs.config.cluster import ClusterConfig
from corral.libs.core.reservations import INVALID_NODES, INVALID_PARTITION, INVALID_RESV, may_use
from corral.libs.runtime.errors import Forbidden, InvalidInput, TransientError
from corral.libs.runtime.ports import Clock, EventLog
from corral.schemas import api, subjects
from corral.schemas import events as ev

#: How long the gateway waits for the scheduler's answer to a reservation request.
ANSWER_TIMEOUT_S = 10.0
#: Pause between two looks at the answer subjects.
_POLL_S = 0.05
#: Slurm's refusal of a non-admin.
DENIED = "Access/permission denied"
#: Slurm's refusal of a job asking for a reservation its user may not use.
ACCESS_DENIED = "Access denied to requested reservation"
_FLAGS = frozenset(get_args(ev.ReservationFlag))
_ANSWERS = ("reservation_created", "reservation_rejected", "reservation_deleted")


def check_create(req: api.CreateReservationRequest, config: ClusterConfig, now: float) -> None:
    """Raise InvalidInput naming the field if the request can never be carried out on this cluster."""
    if not subjects.valid_token(req.name):
        raise InvalidInput(
            f"ReservationName={req.name!r}: use 1-64 letters, digits, - or _", field="ReservationName"
        )
    given = [bool(req.nodes), req.node_count != 0, req.gpu_count != 0]
    if sum(given) != 1:
        raise InvalidInput("give exactly one of Nodes=, NodeCnt= or TRES=gres/gpu=N", field="Nodes")
    if req.node_count < 0 or req.gpu_count < 0:
        raise InvalidInput("NodeCnt= and TRES=gres/gpu= must be positive", field="NodeCnt")
    known = {n.name for n in config.nodes}
    unknown = sorted(set(req.nodes) - known)
    if unknown:
        raise InvalidInput(f"{INVALID_NODES}: {', '.join(unknown)}", field="Nodes")
    if req.partition is not None and config.partition(req.partition) is None:
        raise InvalidInput(f"{INVALID_PARTITION}: {req.partition}", field="PartitionName")
    if not (math.isfinite(req.start_time) and math.isfinite(req.end_time)):
        raise InvalidInput("StartTime= and EndTime= must be times", field="StartTime")
    if req.end_time <= req.start_time:
        raise InvalidInput(
            "EndTime= must be after StartTime= (or give a positive Duration=)", field="EndTime"
        )
    if req.end_time <= now:
        raise InvalidInput("the reservation would be over already: give a later EndTime=", field="EndTime")
    if not req.users and not req.accounts:
        raise InvalidInput("give Users= or Accounts= (who may use the reservation)", field="Users")
    bad = [u for u in req.users if not subjects.valid_token(u)]
    if bad:
        raise InvalidInput(f"Users=: invalid user name {bad[0]!r}", field="Users")
    flags = [f for f in req.flags if f not in _FLAGS]
    if flags:
        raise InvalidInput(
            f"Flags={flags[0]} is not supported by Corral yet: use {', '.join(sorted(_FLAGS))}", field="Flags"
        )


class Reservations:
    """The gateway's reservation verbs, and the lookup submit uses."""

    def __init__(self, events: EventLog, config: ClusterConfig, admins: frozenset[str], clock: Clock) -> None:
        self.events = events
        self.config = config
        self.admins = admins
        self.clock = clock

    async def create(self, user: str, req: api.CreateReservationRequest) -> api.ReservationReply:
        """Append the create request (admins only) and wait for the scheduler's decision."""
        if user not in self.admins:
            raise Forbidden(DENIED)
        check_create(req, self.config, self.clock.now())
        intent = ev.ReservationCreateRequested(
            name=req.name,
            user=user,
            start_time=req.start_time,
            end_time=req.end_time,
            nodes=sorted(set(req.nodes)),
            node_count=req.node_count,
            gpu_count=req.gpu_count,
            partition=req.partition,
            users=list(req.users),
            accounts=list(req.accounts),
            flags=cast(list[ev.ReservationFlag], sorted(set(req.flags))),
        )
        answer = await self._ask(intent)
        if isinstance(answer, ev.ReservationRejected):
            raise InvalidInput(f"Error creating the reservation: {answer.reason}", field="ReservationName")
        return api.ReservationReply(name=req.name)

    async def delete(self, user: str, req: api.DeleteReservationRequest) -> api.ReservationReply:
        """Append the delete request (admins only) and wait for the scheduler's decision."""
        if user not in self.admins:
            raise Forbidden(DENIED)
        if not subjects.valid_token(req.name):
            raise InvalidInput(f"Error deleting the reservation: {INVALID_RESV}", field="ReservationName")
        answer = await self._ask(ev.ReservationDeleteRequested(name=req.name, user=user))
        if isinstance(answer, ev.ReservationRejected):
            raise InvalidInput(f"Error deleting the reservation: {answer.reason}", field="ReservationName")
        return api.ReservationReply(name=req.name)

    async def _ask(self, intent: ev.ReservationCreateRequested | ev.ReservationDeleteRequested) -> ev.Event:
        """Append ``intent``; the scheduler's first decision on its name after it."""
        appended = await self.events.append(intent, correlation_id=intent.name)
        deadline = self.clock.monotonic() + ANSWER_TIMEOUT_S
        while self.clock.monotonic() < deadline:
            for tag in _ANSWERS:
                entry = await self.events.last_entry(subjects.resv_subject(intent.name, tag))
                if entry is not None and entry.seq > appended.seq and entry.envelope is not None:
                    return entry.envelope.body
            await self.clock.sleep(_POLL_S)
        raise TransientError(
            f"the scheduler did not answer about reservation {intent.name} in time; "
            "see scontrol show reservation"
        )

    async def current(self, name: str) -> ev.ReservationCreated | None:
        """The reservation of that name now (from its newest creation and deletion), None if none."""
        created = await self.events.last_entry(subjects.resv_subject(name, "reservation_created"))
        if created is None or created.envelope is None:
            return None
        body = created.envelope.body
        deleted = await self.events.last_entry(subjects.resv_subject(name, "reservation_deleted"))
        if deleted is not None and deleted.seq > created.seq:
            return None
        if not isinstance(body, ev.ReservationCreated) or body.end_time <= self.clock.now():
            return None
        return body

    async def check_job(self, user: str, spec: ev.JobSpec) -> None:
        """Refuse a job that asks for a reservation that does not exist or that its user may not use."""
        name = spec.reservation
        if name is None:
            return
        resv = await self.current(name) if subjects.valid_token(name) else None
        if resv is None:
            raise InvalidInput(f"{INVALID_RESV}: {name}", field="reservation")
        if not may_use(resv, user, spec.account or user):
            raise Forbidden(ACCESS_DENIED)
