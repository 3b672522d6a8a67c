"""scontrol update NodeName= State=DRAIN|DOWN|RESUME at the gateway, with health answering on the same
in-memory log, and advance reservations' times, on the fake clock.

The gateway appends an intent per node and waits (10 s of clock time at most) for health's answer; the
fake clock makes that wait exact and instant.
"""

from __future__ import annotations

import asyncio

import pytest

from corral.libs.core.reservations import INVALID_RESV
from corral.libs.runtime.errors import Forbidden, InvalidInput, TransientError
from corral.schemas import api
from corral.schemas import events as ev
from corral.services.gateway.nodes import ANSWER_TIMEOUT_S
from tests.unit.builders import registered
from tests.unit.rigs import ADMIN, HEALTH_SLEEPERS, Rig, drive, running

# A fake clock nobody advances would hang a test that waits on it: fail it fast instead.
pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]

NODE = ev.NodeName("gpu01")


def drain(state: str = "DRAIN", node: str = NODE) -> api.NodeUpdateRequest:
    return api.NodeUpdateRequest(nodes=[node], state=state, reason="bad fan")


async def test_a_drain_is_done_once_health_has_answered_it() -> None:
    rig = Rig()
    await rig.log.append(registered(NODE))
    async with running(rig.log, rig.clock):
        reply, took = await drive(rig.clock, rig.gateway.node_updates.update(ADMIN, drain()), HEALTH_SLEEPERS)
    assert reply.nodes == [NODE] and took < 1.0
    assert rig.log.bodies(f"corral.evt.node.{NODE}.>")[1:] == [
        ev.NodeDrainRequested(node=NODE, user=ADMIN, reason="bad fan"),
        ev.NodeDrained(node=NODE, reason="bad fan", by=ADMIN),
    ]


async def test_without_health_the_request_stays_and_the_reply_says_so_after_the_timeout() -> None:
    rig = Rig()
    await rig.log.append(registered(NODE))
    with pytest.raises(TransientError, match="health did not confirm node gpu01 in time"):
        await drive(rig.clock, rig.gateway.node_updates.update(ADMIN, drain()), 0)
    waited = rig.clock.monotonic() - 1_000.0
    assert ANSWER_TIMEOUT_S <= waited < ANSWER_TIMEOUT_S + 0.1
    assert rig.log.bodies(f"corral.evt.node.{NODE}.node_drain_requested") == [
        ev.NodeDrainRequested(node=NODE, user=ADMIN, reason="bad fan")
    ]


async def test_a_down_is_answered_only_by_an_admins_node_down() -> None:
    rig = Rig()
    await rig.log.append(registered(NODE))
    update = asyncio.ensure_future(drive(rig.clock, rig.gateway.node_updates.update(ADMIN, drain("DOWN")), 0))
    await rig.clock.asleep()  # the intent is in the log and the gateway waits for the answer
    # Health's own "Not responding" after the intent is no answer to the admin's DOWN.
    await rig.log.append(ev.NodeDown(node=NODE, reason="Not responding"))
    with pytest.raises(TransientError, match="did not confirm"):
        await update


REFUSED: list[tuple[str, str, api.NodeUpdateRequest, type[Exception], str]] = [
    ("not-an-admin", "alice", drain(), Forbidden, "Access/permission denied"),
    ("unknown-node", ADMIN, drain(node="gpu99"), InvalidInput, "Invalid node name specified"),
    ("resume-not-drained", ADMIN, drain("RESUME"), InvalidInput, "not drained nor downed"),
    ("down-unregistered", ADMIN, drain("DOWN", node="gpu02"), InvalidInput, "never registered"),
]


@pytest.mark.parametrize(
    ("user", "req", "error", "needle"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
async def test_a_refused_node_update_appends_nothing(
    user: str, req: api.NodeUpdateRequest, error: type[Exception], needle: str
) -> None:
    rig = Rig()
    await rig.log.append(registered(NODE))
    with pytest.raises(error, match=needle):
        await rig.gateway.node_updates.update(user, req)
    assert len(rig.log.bodies()) == 1


async def test_a_job_may_ask_for_a_reservation_until_it_ends() -> None:
    rig = Rig()
    now = rig.clock.now()
    await rig.log.append(
        ev.ReservationCreated(
            name="maint", start_time=now, end_time=now + 3600, nodes=[NODE], users=["alice"]
        )
    )
    await rig.submit(token="during", reservation="maint")
    with pytest.raises(Forbidden):
        await rig.submit(user="bob", token="not-bob", reservation="maint")
    rig.clock.advance(3600)
    with pytest.raises(InvalidInput, match=INVALID_RESV):
        await rig.submit(token="after", reservation="maint")
    assert len(rig.log.bodies("corral.evt.job.*.job_submitted")) == 1


async def test_a_reservation_already_over_is_refused_by_the_clocks_time() -> None:
    rig = Rig()
    now = rig.clock.now()
    request = api.CreateReservationRequest(
        name="late", start_time=now - 7200, end_time=now - 1, node_count=1, users=["alice"]
    )
    with pytest.raises(InvalidInput, match="would be over already"):
        await drive(rig.clock, rig.gateway.reservations.create(ADMIN, request), 0)
    assert rig.log.bodies() == []
