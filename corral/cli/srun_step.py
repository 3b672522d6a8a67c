"""One running step, seen from srun: ask the batch node's agent for it, stream it, forward stdin and
Ctrl-C, and collect the task exits (asyncio and nats-py: srun lives as long as its step)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING

import msgspec

from corral.cli.errors import CliError
from corral.cli.srun_io import Labeller, exit_message, step_status
from corral.schemas.api import ApiError
from corral.schemas.steps import StepLaunch, StepLaunched, StepSignal, TaskExit, io_subject, step_subject
from corral.schemas.subjects import inbox_prefix

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg

    from corral.cli.client import Cluster

#: A second Ctrl-C within this many seconds kills the step (Slurm's srun).
DOUBLE_INTERRUPT_S = 1.0
#: Signals srun passes on to its step's tasks instead of dying of them, as Slurm's srun does: a
#: ``scancel --signal`` or a ``--signal=SIG@T`` warning reaches the processes of the batch step, srun among
#: them, and must get to the tasks (submitit's USR2, a trainer's TERM handler), on every node of the step.
FORWARDED = (signal.SIGHUP, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT)


class StepSession:
    """One step from start to the last task's exit."""

    def __init__(
        self, cluster: Cluster, batch_node: str, launch: StepLaunch, label: bool, command: str
    ) -> None:
        self.cluster = cluster
        self.batch_node = batch_node
        self.launch = launch
        self.label = label
        self.command = command
        self.exits: dict[int, TaskExit] = {}
        self.all_exited = asyncio.Event()
        self.ntasks = 0
        self.step_id = -1
        self.labeller = Labeller(1)
        self.last_interrupt = 0.0
        self.pending: list[Msg] = []  # output that arrived before the launch reply
        self.held: list[int] = []  # signals that arrived before the step had an id, forwarded once it has
        self.sending: set[asyncio.Future[None]] = set()  # forwarded signals on their way

    async def run(self) -> int:
        """The step's status (the worst task's)."""
        import nats

        user = self.cluster.user
        try:
            nc = await nats.connect(
                self.cluster.url,
                user=user,
                password=self.cluster.credentials.password,
                inbox_prefix=inbox_prefix(user),
                name=f"srun-{os.getpid()}",
                max_reconnect_attempts=3,
                allow_reconnect=True,
            )
        except Exception as exc:
            raise CliError(f"cannot connect to the cluster at {self.cluster.url}: {exc}") from None
        try:
            return await self._run(nc)
        finally:
            with contextlib.suppress(Exception):
                await nc.close()

    async def _run(self, nc: Client) -> int:
        loop = asyncio.get_running_loop()
        for sig in FORWARDED:
            loop.add_signal_handler(sig, self._forward_signal, nc, sig)
        try:
            return await self._step(nc, loop)
        finally:
            for sig in FORWARDED:
                loop.remove_signal_handler(sig)

    async def _step(self, nc: Client, loop: asyncio.AbstractEventLoop) -> int:
        user, key = self.cluster.user, self.launch.key
        await nc.subscribe(f"corral.io.{user}.{key}.>", cb=self._on_io)
        try:
            msg = await nc.request(
                step_subject(self.batch_node, user),
                msgspec.json.encode(self.launch),
                timeout=self.cluster.timeout,
            )
        except Exception as exc:
            name = type(exc).__name__
            raise CliError(f"the agent of node {self.batch_node} did not start the step ({name})") from None
        reply = msgspec.json.decode(msg.data, type=StepLaunched | ApiError)
        if isinstance(reply, ApiError):
            raise CliError(reply.error)
        self.step_id, self.ntasks = reply.step_id, len(reply.tasks)
        self.labeller = Labeller(self.ntasks)
        for early in self.pending:
            self._handle(early)
        self.pending.clear()
        for sig in self.held:
            self._forward_signal(nc, sig)
        self.held.clear()
        loop.add_signal_handler(signal.SIGINT, lambda: asyncio.ensure_future(self._interrupt(nc)))
        self._forward_stdin(nc, loop, io_subject(user, key, "in"))
        await self.all_exited.wait()
        loop.remove_signal_handler(signal.SIGINT)
        for exit in sorted(self.exits.values(), key=lambda e: e.task):
            message = exit_message(exit)
            if message is not None:
                print(f"{self.command}: error: {message}", file=sys.stderr)
        return step_status(list(self.exits.values()))

    async def _on_io(self, msg: Msg) -> None:
        if self.step_id < 0:
            self.pending.append(msg)
            return
        self._handle(msg)

    def _handle(self, msg: Msg) -> None:
        parts = msg.subject.split(".")
        if len(parts) != 6 or not parts[5].isdigit():
            return
        kind, task = parts[4], int(parts[5])
        if kind == "exit":
            with contextlib.suppress(msgspec.DecodeError):
                self.exits[task] = msgspec.json.decode(msg.data, type=TaskExit)
                for stream in ("out", "err"):
                    self._write(stream, self.labeller.flush(task, stream) if self.label else b"")
            if len(self.exits) >= self.ntasks:
                self.all_exited.set()
        elif kind in ("out", "err"):
            self._write(kind, self.labeller.feed(task, kind, msg.data) if self.label else msg.data)

    @staticmethod
    def _write(stream: str, data: bytes) -> None:
        if not data:
            return
        out = sys.stdout.buffer if stream == "out" else sys.stderr.buffer
        with contextlib.suppress(BrokenPipeError):
            out.write(data)
            out.flush()

    def _forward_signal(self, nc: Client, sig: int) -> None:
        """Pass a signal srun got on to every task of the step (held until the step has an id)."""
        if self.step_id < 0:
            self.held.append(sig)
            return
        request = StepSignal(job_id=self.launch.job_id, step_id=self.step_id, signal=sig)
        future = asyncio.ensure_future(self._send_signal(nc, request))
        self.sending.add(future)
        future.add_done_callback(self.sending.discard)

    async def _send_signal(self, nc: Client, request: StepSignal) -> None:
        with contextlib.suppress(Exception):
            await nc.request(
                step_subject(self.batch_node, self.cluster.user), msgspec.json.encode(request), timeout=5
            )

    async def _interrupt(self, nc: Client) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        twice = now - self.last_interrupt < DOUBLE_INTERRUPT_S
        self.last_interrupt = now
        if twice:
            print(f"{self.command}: forcing job termination", file=sys.stderr)
            sig = signal.SIGKILL
        else:
            print(f"{self.command}: interrupt (one more within 1 sec to abort)", file=sys.stderr)
            sig = signal.SIGINT
        await self._send_signal(nc, StepSignal(job_id=self.launch.job_id, step_id=self.step_id, signal=sig))

    def _forward_stdin(self, nc: Client, loop: asyncio.AbstractEventLoop, subject: str) -> None:
        """Read stdin in a daemon thread (it may block forever on a terminal) and publish it to task 0;
        an empty message tells the agent it ended."""

        def reader() -> None:
            while True:
                try:
                    data = os.read(0, 1 << 16)
                except OSError:
                    data = b""
                future = asyncio.run_coroutine_threadsafe(nc.publish(subject, data), loop)
                with contextlib.suppress(Exception):
                    future.result(timeout=10)
                if not data:
                    return

        if self.launch.stdin:
            threading.Thread(target=reader, name="srun-stdin", daemon=True).start()
