"""One running step, seen from srun: ask the batch node's agent for it, stream it, forward stdin and
Ctrl-C, and collect the task exits.

One thread and one NATS connection (the synchronous client, ``nats_request``: nats-py and asyncio
would cost srun ~150 ms of start-up): srun subscribes to the step's I/O subjects, asks for the step, then
waits with ``select`` on the connection, its stdin (forwarded to task 0) and a self-pipe that a signal wakes:
SIGINT is Ctrl-C (twice within a second kills the step), the signals of ``FORWARDED`` are passed on to every
task, as Slurm's srun does.

srun rides through a NATS outage: when its connection is lost (a server restart) it connects again, for
``REATTACH_S`` seconds at most, and subscribes to the step's I/O subjects again; the tasks run on
meanwhile (the agents keep the step), but what they printed while srun was away may be lost. The agents'
own connections reconnect too (``libs/runtime/streams.py``).

A task's exit travels as a core NATS message, which can be lost. When nothing arrived for
``LIVENESS_S`` seconds srun asks the batch node's agent whether the step still runs (``StepSignal`` with
signal 0, which signals nothing); once the agent no longer knows it, the step is over, and the exits still
missing are taken from the step's accounting record (its ``StepExited`` fact) or, failing that, reported lost.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
from typing import TYPE_CHECKING

import msgspec

from corral.cli.errors import CliError, warn
from corral.cli.srun_io import Labeller, exit_message, step_status
from corral.libs.runtime import nats_request
from corral.libs.runtime.nats_retry import retrying
from corral.schemas.api import ApiError
from corral.schemas.steps import (
    StepDone,
    StepLaunch,
    StepLaunched,
    StepSignal,
    TaskExit,
    io_source,
    io_subject,
    step_subject,
)
from corral.schemas.subjects import inbox_prefix

if TYPE_CHECKING:
    from corral.cli.client import Cluster

#: A second Ctrl-C within this many seconds kills the step (Slurm's srun).
DOUBLE_INTERRUPT_S = 1.0
#: Seconds without any message after which srun asks the agent whether the step still runs.
LIVENESS_S = 5.0
#: Seconds srun tries to connect again after losing its connection, before it gives the step up.
REATTACH_S = 300.0
#: Seconds srun waits for one answer to its step launch before asking again with the same key: an agent
#: that restarted between starting the step and answering never answers the first request, and its
#: successor answers the same key with the step it started (an answer still coming to an earlier request
#: is dropped, each request has its own reply subject).
ASK_AGAIN_S = 3.0
#: Signals srun passes on to its step's tasks instead of dying of them, as Slurm's srun does: a
#: ``scancel --signal`` or a ``--signal=SIG@T`` warning reaches the processes of the batch step, srun among
#: them, and must get to the tasks (submitit's USR2, a trainer's TERM handler), on every node of the step.
FORWARDED = (signal.SIGHUP, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT)


class StepSession:
    """One step from start to the last task's exit."""

    def __init__(
        self,
        cluster: Cluster,
        batch_node: str,
        launch: StepLaunch,
        label: bool,
        command: str,
    ) -> None:
        self.cluster = cluster
        self.batch_node = batch_node
        self.launch = launch
        self.label = label
        self.command = command
        self.exits: dict[int, TaskExit] = {}
        self.ntasks = 0
        self.nodes: dict[int, str] = {}  # task id -> its node, from the step's layout
        self.step_id = -1
        self.labeller = Labeller(1)
        self.interrupts: list[float] = []  # monotonic times of SIGINTs not handled yet
        self.forward: list[int] = []  # other signals received, to pass on to the tasks
        self.last_interrupt = -DOUBLE_INTERRUPT_S
        self.conn: nats_request.Connection  # to NATS, subscribed to the step's I/O; replaced on reattach

    def run(self) -> int:
        """The step's status (the worst task's)."""
        try:
            self.conn = self._connect(self.cluster.retry_s)
        except nats_request.NatsRequestError as exc:
            raise CliError(str(exc)) from None
        try:
            return self._run()
        except nats_request.NatsRequestError as exc:
            raise CliError(f"step {self.launch.job_id}.{self.step_id}: {exc}") from None
        finally:
            self.conn.close()

    def _connect(self, budget: float) -> nats_request.Connection:
        """A connection subscribed to the step's I/O subjects; a refused one is tried again for
        ``budget`` seconds."""
        user = self.cluster.user

        def attempt() -> nats_request.Connection:
            conn = nats_request.Connection(
                self.cluster.url,
                user=user,
                password=self.cluster.login().password,
                inbox_prefix=inbox_prefix(user),
                timeout=self.cluster.timeout,
            )
            try:
                conn.subscribe(f"corral.io.{user}.{self.launch.key}.>")
            except BaseException:
                conn.close()
                raise
            return conn

        return retrying(attempt, budget)

    def _reattach(self) -> None:
        """The connection was lost: connect and subscribe again (``REATTACH_S`` at most)."""
        step = f"{self.launch.job_id}.{self.step_id}"
        warn(self.command, f"lost the connection to the cluster; reattaching to step {step}")
        self.conn.close()
        try:
            self.conn = self._connect(REATTACH_S)
        except nats_request.NatsRequestError as exc:
            # A CliError: the stream loop would take a NatsRequestError for a lost connection again.
            raise CliError(f"could not reattach to step {step} within {REATTACH_S:g} s: {exc}") from None
        warn(self.command, f"reattached to step {step}")

    def _run(self) -> int:
        # Signals are taken before the step is asked for, and handled in the loop once it has an id.
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        old_wakeup = signal.set_wakeup_fd(wake_w)
        old_handlers = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, *FORWARDED)}
        try:
            reply = self._launch(self.conn)
            self.step_id, self.ntasks = reply.step_id, len(reply.tasks)
            self.nodes = {place.task: place.node for place in reply.tasks}
            self.labeller = Labeller(self.ntasks)
            self._stream(wake_r)
        finally:
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
            signal.set_wakeup_fd(old_wakeup)
            os.close(wake_r)
            os.close(wake_w)
        for exit in sorted(self.exits.values(), key=lambda e: e.task):
            message = exit_message(exit)
            if message is not None:
                print(f"{self.command}: error: {message}", file=sys.stderr)
        return step_status(list(self.exits.values()))

    def _launch(self, conn: nats_request.Connection) -> StepLaunched:
        subject = step_subject(self.batch_node, self.cluster.user)
        # Where the cluster sees srun (the tasks' SLURM_LAUNCH_NODE_IPADDR, SLURM_SRUN_COMM_HOST and _PORT).
        host, port = conn.local_address()
        self.launch = msgspec.structs.replace(self.launch, srun_host=host, srun_port=port)
        data = msgspec.json.encode(self.launch)
        deadline = time.monotonic() + self.cluster.retry_s + self.cluster.timeout

        def ask() -> nats_request.Reply:
            # No answer in time: the agent may have started the step and restarted before replying. It
            # answers a launch with a key it knows with that step (once that launch is done, if it is still
            # under way), so asking again starts nothing twice.
            while True:
                left = deadline - time.monotonic()
                try:
                    return conn.request(subject, data, timeout=max(0.0, min(ASK_AGAIN_S, left)))
                except nats_request.RequestTimeout:
                    if time.monotonic() >= deadline:
                        raise

        try:
            # No responders: the agent is not subscribed (yet), so the request reached no one (nats_retry).
            msg = retrying(ask, self.cluster.retry_s)
        except nats_request.NoResponders:
            raise CliError(f"the agent of node {self.batch_node} is not answering") from None
        except nats_request.NatsRequestError as exc:
            name = type(exc).__name__
            raise CliError(f"the agent of node {self.batch_node} did not start the step ({name})") from None
        reply = msgspec.json.decode(msg.data, type=StepLaunched | ApiError)
        if isinstance(reply, ApiError):
            raise CliError(reply.error)
        return reply

    def _stream(self, wake: int) -> None:
        in_subject = io_subject(self.cluster.user, self.launch.key, "in", None, self.nodes.get(0, ""))
        stdin_open = self.launch.stdin
        quiet_since = time.monotonic()
        while len(self.exits) < self.ntasks:
            try:
                if self.conn.fileno() < 0:  # lost (a server restart): the step runs on without us
                    self._reattach()
                    quiet_since = time.monotonic() - LIVENESS_S  # ask the agent now: exits may be lost
                stdin_open, quiet_since, over = self._once(wake, in_subject, stdin_open, quiet_since)
            except nats_request.NatsRequestError:
                if self.conn.fileno() >= 0:
                    raise  # not a lost connection: a refusal, a protocol error
                continue
            if over:
                self._fill_lost_exits()
                return

    def _once(
        self, wake: int, in_subject: str, stdin_open: bool, quiet_since: float
    ) -> tuple[bool, float, bool]:
        """Handle what is ready, or wait for something: (stdin still open, when the step was last heard
        of, whether the agent says the step is over)."""
        conn = self.conn
        msg = conn.next_message(0)
        if msg is not None:
            self._handle(msg)
            return stdin_open, time.monotonic(), False
        self._handle_interrupts(conn)
        waiting = [conn.fileno(), wake] + ([0] if stdin_open else [])
        timeout = max(0.0, quiet_since + LIVENESS_S - time.monotonic())
        try:
            readable, _, _ = select.select(waiting, [], [], timeout)
        except ValueError:  # stdin was closed under us
            readable, stdin_open = [], False
        if wake in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wake, 512)
        if 0 in readable:
            try:
                data = os.read(0, 1 << 16)
            except OSError:
                data = b""
            conn.publish(in_subject, data)  # an empty message is end of file
            stdin_open = bool(data)
        if not readable and time.monotonic() - quiet_since >= LIVENESS_S:
            if not self._step_alive(conn):
                return stdin_open, quiet_since, True
            quiet_since = time.monotonic()
        return stdin_open, quiet_since, False

    def _handle(self, msg: nats_request.Message) -> None:
        source = io_source(msg.subject, self.nodes)
        if source is None:
            return  # not from the node of the task it names
        kind, task = source
        if kind == "exit":
            with contextlib.suppress(msgspec.DecodeError):
                self.exits[task] = msgspec.json.decode(msg.data, type=TaskExit)
                for stream in ("out", "err"):
                    self._write(stream, self.labeller.flush(task, stream) if self.label else b"")
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

    def _on_signal(self, signum: int, frame: object) -> None:
        if signum == signal.SIGINT:
            self.interrupts.append(time.monotonic())
        else:
            self.forward.append(signum)

    def _handle_interrupts(self, conn: nats_request.Connection) -> None:
        """Forward the signals received: SIGINT to the tasks, or the kill when within a second of the last;
        the others (``FORWARDED``) as they are."""
        while self.forward:
            with contextlib.suppress(nats_request.NatsRequestError):
                self._signal(conn, self.forward.pop(0))
        while self.interrupts:
            at = self.interrupts.pop(0)
            twice = at - self.last_interrupt < DOUBLE_INTERRUPT_S
            self.last_interrupt = at
            if twice:
                print(f"{self.command}: forcing job termination", file=sys.stderr)
                sig = signal.SIGKILL
            else:
                print(f"{self.command}: interrupt (one more within 1 sec to abort)", file=sys.stderr)
                sig = signal.SIGINT
            with contextlib.suppress(nats_request.NatsRequestError):
                self._signal(conn, sig)

    def _signal(self, conn: nats_request.Connection, sig: int) -> StepDone | ApiError:
        request = StepSignal(job_id=self.launch.job_id, step_id=self.step_id, signal=sig)
        reply = conn.request(
            step_subject(self.batch_node, self.cluster.user), msgspec.json.encode(request), timeout=5
        )
        return msgspec.json.decode(reply.data, type=StepDone | ApiError)

    def _step_alive(self, conn: nats_request.Connection) -> bool:
        """Whether the batch node's agent still runs the step (signal 0 signals nothing); an agent that
        cannot be asked counts as alive (srun keeps waiting, as for a slow step)."""
        try:
            answer = self._signal(conn, 0)
        except nats_request.NatsRequestError:
            return True
        return not (isinstance(answer, ApiError) and answer.code == "not_found")

    def _fill_lost_exits(self) -> None:
        """The step is over but some exits never arrived: take the step's recorded end for them."""
        missing = [t for t in range(self.ntasks) if t not in self.exits]
        recorded = self._recorded_end()
        tasks = ",".join(map(str, missing))
        if recorded is None:
            warn(self.command, f"the exit status of task(s) {tasks} was lost; counting them as failed")
            code, sig = 1, 0
        else:
            code, sig = recorded
        for task in missing:
            self.exits[task] = TaskExit(task=task, node=self.nodes.get(task, "?"), exit_code=code, signal=sig)

    def _recorded_end(self) -> tuple[int, int] | None:
        """(exit code, signal) of the step's accounting record once it ended; None if not recorded in time."""
        from corral.schemas.api import AcctReply, AcctRequest

        for _ in range(20):
            with contextlib.suppress(CliError):
                reply = self.cluster.call("acct", AcctRequest(job_ids=[self.launch.job_id]), AcctReply)
                for job in reply.jobs:
                    for step in job.steps:
                        if step.step == str(self.step_id) and step.state != "RUNNING":
                            return step.exit_code, step.signal
            time.sleep(0.1)
        return None
