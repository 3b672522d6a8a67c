"""The step request server of a node: answers ``corral.step.<node>.<caller>`` (``corral.schemas.steps``).

The caller is the subject's last token, bound by the NATS permissions: the job's owner (srun) may launch
and signal its steps and release its interactive allocation; only agents (``agent-<node>``) may start a
step's tasks here (``StepTasks``), poll their exits (``StepPoll``) or signal them as peers. Each request
is answered in a task of its own: a launch waits for peers, which may be waiting for us. As every API
server does (``api_server.refuse_reply``), it answers only on the caller's own inbox: a request whose reply
subject is anywhere else is dead-lettered unanswered.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from corral.libs.runtime import telemetry
from corral.libs.runtime.api_server import refuse_reply
from corral.schemas import subjects
from corral.schemas.api import ApiError, LaunchOrder
from corral.schemas.steps import (
    StepDone,
    StepLaunch,
    StepLaunched,
    StepPoll,
    StepPolled,
    StepRequest,
    StepSignal,
    StepTasks,
    step_subject,
)
from corral.services.agent import allocation
from corral.services.agent.background import Background
from corral.services.agent.step_coord import LocalTasks
from corral.services.agent.step_state import RunsView, StepError, StepTable


class Coordinator(Protocol):
    """What the server needs of the steps this (batch) node coordinates."""

    async def launch(self, order: LaunchOrder, launch: StepLaunch) -> StepLaunched:
        """Number, lay out and start a step of the order's run."""

    async def signal_step(self, caller: str, request: StepSignal) -> None:
        """srun's signal to its step, on every node."""


class StepServer:
    """Answers the step requests of srun and of the peer agents."""

    def __init__(
        self,
        nc: Client,
        node: str,
        runs: RunsView,
        table: StepTable,
        local: LocalTasks,
        coord: Coordinator,
        background: Background,
    ) -> None:
        self.nc = nc
        self.node = node
        self.runs = runs  # the node's runs (who owns a job running here)
        self.table = table  # the node's steps (a poll's answer)
        self.local = local  # this node's tasks of steps
        self.coord = coord  # the steps this node coordinates
        self.background = background  # where each request is answered
        self.log = telemetry.logger(node=node)

    async def start(self) -> None:
        """Answer step requests for this node from now on."""
        await self.nc.subscribe(step_subject(self.node, "*"), cb=self._on_request)

    async def _on_request(self, msg: Msg) -> None:
        caller = msg.subject.rsplit(".", 1)[-1]
        if msg.reply and not subjects.own_inbox(caller, msg.reply):
            await refuse_reply(self.nc, f"agent-{self.node}", msg, caller)
            return
        # Each request in its own task: a launch waits for peers, which may be waiting for us.
        self.background.spawn(self._answer(msg))

    async def _answer(self, msg: Msg) -> None:
        caller = msg.subject.rsplit(".", 1)[-1]
        reply: msgspec.Struct
        try:
            request = msgspec.json.decode(msg.data, type=StepRequest)
            reply = await self._dispatch(caller, request)
        except msgspec.DecodeError as exc:
            reply = ApiError(error=f"malformed step request: {exc}")
        except StepError as exc:
            reply = ApiError(error=str(exc), code=exc.code)
        except Exception as exc:
            self.log.exception("step request failed")
            reply = ApiError(
                error=f"node {self.node}: internal error ({type(exc).__name__})", code="internal"
            )
        if msg.reply:
            with contextlib.suppress(Exception):
                await msg.respond(msgspec.json.encode(reply))

    async def _dispatch(self, caller: str, request: StepRequest) -> msgspec.Struct:
        peer = caller.startswith("agent-")
        if isinstance(request, StepTasks):
            if not peer:
                raise StepError("Access/permission denied", "forbidden")
            await self.local.start(
                request.order, request.step_id, request.user, request.launch, request.tasks
            )
            return StepDone()
        if isinstance(request, StepPoll):
            if not peer:
                raise StepError("Access/permission denied", "forbidden")
            local = self.table.local.get((request.job_id, request.attempt, request.step_id))
            return StepPolled(known=local is not None, exits=list(local.exits.values()) if local else [])
        if isinstance(request, StepSignal):
            if peer:
                self.local.signal(
                    request.job_id, request.attempt, request.step_id, request.signal, request.raw
                )
            else:
                await self.coord.signal_step(caller, request)
            return StepDone()
        order = self._owned_order(caller, request.job_id)
        if isinstance(request, StepLaunch):
            return await self.coord.launch(order, request)
        await allocation.release(order, self.runs.run_dir(order.job_id, order.attempt), request.exit_code)
        return StepDone()

    def _owned_order(self, caller: str, job_id: int) -> LaunchOrder:
        order = self.runs.running_order(job_id)
        if order is None:
            raise StepError(f"Job {job_id} is not running on {self.node}, its batch node", "not_found")
        if order.user != caller:
            raise StepError("Access/permission denied", "forbidden")
        return order
