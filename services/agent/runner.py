"""Running one batch script under its supervisor and supervising it to its end, across agent restarts.

The agent does not run the script itself: it starts a detached supervisor (``stepd.py``, Slurm's
slurmstepd, the same that runs srun's steps; the script is its step ``batch``) in its own session, which
starts the script in its own session in the submit directory, waits for it and writes its exit status
to ``<run dir>/status``. So the job outlives the agent;
the agent supervises through its record (records.py: supervisor pid and start ticks, script pid = process
group, start time, deadline, warning signal) and the status file, whether it started the run in this
lifetime or re-adopts it after a restart.

Time limit (Slurm's order): ``--signal`` SIG once, T seconds before the deadline (to the tasks of the run's
steps on every node, or with ``B:`` to the batch shell only); at the deadline the kill sequence. A kill on an
order (cancel, requeue, preemption) is the same sequence, with the grace time of a preemption that grants
one. The supervisor runs it (``killseq.py``: SIGCONT + SIGTERM to the script's process group and to every
process in the run's cgroup, srun's tasks here included, SIGKILL after the grace), the agent asks for it;
the ending is recorded before, so an agent restarted mid-sequence reports the run ``killed`` / ``timed_out``
while the supervisor carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from corral.libs.runtime.clock import SystemClock
from corral.libs.runtime.ports import Clock
from corral.schemas.api import LaunchOrder
from corral.services.agent import killseq, memcg, procstat, stepd, taskstart
from corral.services.agent.identity import JobUser
from corral.services.agent.jobenv import NodeEnv, job_environment, output_paths
from corral.services.agent.records import Record, Records
from corral.services.agent.stepdir import BATCH_STEP, OutputTarget, StepDir, StepSpec, TaskSpec
from corral.services.agent.supervisor import Supervisor, Supervisors

#: How often an adopted run (not this process's child) is checked.
POLL_S = 0.2
#: A run directory's marker: the run was killed while its agent was down (reported ``killed``).
KILLED_FILE = "killed"
#: How long the supervisor may take to start the script and answer.
HANDSHAKE_S = 30.0


class LaunchError(Exception):
    """The script could not be started; the message is for the user."""


@dataclass
class Outcome:
    """How a run ended."""

    exit_code: int  # exit status (0 if killed by a signal)
    signal: int  # terminating signal
    timed_out: bool  # killed at its time limit
    killed: bool  # killed on an order
    oom: bool = False  # the kernel's OOM killer ended it (only when known)


# pure parts ----------------------------------------------------------------------------------------
def launch_record(order: LaunchOrder, now: float) -> Record:
    """The record of a launch decided here, written before anything runs. It holds the run's time limit and
    ``--signal`` warning already (the deadline counts from now, a few ms before the script starts), so that a
    run adopted after an agent stopped in the middle of its launch keeps them. ``now``: the agent's clock."""
    started_at = now
    warn = order.spec.warn_signal
    return Record(
        job_id=order.job_id,
        attempt=order.attempt,
        start_reported=False,
        started_at=started_at,
        deadline=deadline_of(started_at, order.time_limit_s),
        warn_signal=warn.signum if warn else 0,
        warn_before_s=warn.seconds_before if warn else 0,
        warn_batch_only=warn.batch_only if warn else False,
        traceparent=order.traceparent,
        cause_id=order.cause_id or "",
    )


def deadline_of(started_at: float, time_limit_s: int | None) -> float | None:
    """Unix time a run reaches its limit (None: unlimited)."""
    return None if time_limit_s is None else started_at + time_limit_s


def warn_at(rec: Record) -> float | None:
    """When the ``--signal`` warning is due (None: none, or already sent); at once if T exceeds the limit."""
    if not rec.warn_signal or rec.warned or rec.deadline is None:
        return None
    return max(rec.started_at, rec.deadline - rec.warn_before_s)


def next_wakeup(rec: Record) -> float | None:
    """The next moment the supervisor must act on its own: the warning, else the deadline."""
    times = [t for t in (warn_at(rec), None if rec.ending else rec.deadline) if t is not None]
    return min(times, default=None)


def decode_status(data: bytes, rec: Record) -> Outcome:
    """The outcome from a status file's bytes and the record's ending (killed / timed out)."""
    status = json.loads(data)
    return Outcome(
        exit_code=int(status.get("exit_code", 0)),
        signal=int(status.get("signal", 0)),
        timed_out=rec.ending == "timed_out",
        killed=rec.ending == "killed",
        oom=bool(status.get("oom", False)),
    )


def vanished(rec: Record) -> Outcome:
    """The outcome of a run whose supervisor is gone without writing a status: killed (SIGKILL)."""
    return Outcome(
        exit_code=0,
        signal=int(signal.SIGKILL),
        timed_out=rec.ending == "timed_out",
        killed=rec.ending != "timed_out",
    )


def read_pids(run_dir: Path) -> tuple[int, int, int] | None:
    """(supervisor pid, its start ticks, script pid) from the run directory, once the supervisor started
    the script."""
    pids = StepDir.batch(run_dir, 0, 0).pids()
    if pids is None or "0" not in pids.tasks:
        return None
    return pids.stepd[0], pids.stepd[1], pids.tasks["0"][0]


# the run -------------------------------------------------------------------------------------------
#: (job, attempt, signal) -> signal the run's step tasks on every node (the agent's steps do it).
StepSignaller = Callable[[int, int, int], None]


class Run:
    """One run on this node, supervised through its record and status file."""

    def __init__(
        self,
        rec: Record,
        run_dir: Path,
        records: Records,
        kill_wait: float,
        proc: Supervisor | None = None,
        step_signaller: StepSignaller | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.rec = rec
        self.run_dir = run_dir
        self.records = records
        self.kill_wait = kill_wait
        self.proc = proc  # the supervisor, when this agent process started it (None: adopted)
        self.ended = asyncio.Event()
        self.step_signaller = step_signaller  # the --signal warning's way to the run's step tasks everywhere
        self.clock = clock or SystemClock()  # when the warning and the time limit are due

    @property
    def pid(self) -> int:
        """Batch shell pid (= the job's process group id)."""
        return self.rec.pid

    @property
    def key(self) -> tuple[int, int]:
        """(job, attempt)."""
        return (self.rec.job_id, self.rec.attempt)

    def status(self) -> Outcome | None:
        """The outcome from the status file, if the supervisor wrote it."""
        try:
            data = (self.run_dir / stepd.STATUS_FILE).read_bytes()
        except OSError:
            return None
        try:
            return decode_status(data, self.rec)
        except (ValueError, TypeError, AttributeError):
            return None

    def supervisor_alive(self) -> bool:
        """The recorded supervisor process still exists (same pid and start time, not a zombie)."""
        if self.proc is not None:
            return self.proc.alive()
        return procstat.start_ticks(self.rec.supervisor) == self.rec.supervisor_start

    async def _until_ended(self) -> None:
        if self.proc is not None:
            await self.proc.wait()
            return
        while self.supervisor_alive() and self.status() is None:
            await asyncio.sleep(POLL_S)

    async def wait(self) -> Outcome:
        """Supervise to the end: deliver the warning signal, enforce the deadline; then the outcome."""
        if self.rec.ending:
            # an agent that stopped between recording a kill and asking for it asks now (the supervisor
            # runs its sequence once, however often it is asked)
            self._request_kill(self.kill_wait)
        done = asyncio.ensure_future(self._until_ended())
        over = asyncio.Event()
        done.add_done_callback(lambda _: over.set())
        try:
            while not done.done():
                wake = next_wakeup(self.rec)
                if wake is None:
                    await over.wait()
                else:
                    await self.clock.sleep(max(wake - self.clock.now(), 0.0), wake=over)
                if not done.done():
                    self._on_time(self.clock.now())
        finally:
            done.cancel()
        self.ended.set()
        return self.status() or vanished(self.rec)

    def _on_time(self, now: float) -> None:
        due = warn_at(self.rec)
        if due is not None and now >= due:
            self.rec = self.records.update(*self.key, warned=True)
            # Slurm's --signal: to the job's steps but not the batch shell; with B: to the batch shell only.
            if self.rec.warn_batch_only:
                self.signal(self.rec.warn_signal, batch_only=True)
            else:
                self.signal_steps(self.rec.warn_signal)
        if not self.rec.ending and self.rec.deadline is not None and now >= self.rec.deadline:
            self.kill(timed_out=True)

    def signal(self, signum: int, batch_only: bool = False) -> None:
        """Send a signal to the job's processes (or its batch shell only)."""
        if self.pid <= 0:
            return  # no script here (a run this node only kills: killpg(0) would be our own group)
        target = os.kill if batch_only else os.killpg
        with contextlib.suppress(ProcessLookupError, PermissionError):
            target(self.pid, signum)

    def signal_steps(self, signum: int) -> None:
        """Send a signal to the tasks of the run's steps on every node (Slurm's ``--signal`` without ``B:``):
        not the batch shell, nor what the script started itself; the agent's step server delivers it."""
        if self.step_signaller is not None:
            self.step_signaller(self.rec.job_id, self.rec.attempt, signum)

    def kill(self, *, timed_out: bool = False, grace_s: float | None = None) -> None:
        """Have the supervisor run its kill sequence (killseq.py), once: recorded first, so that the run is
        reported killed or timed out; ``grace_s`` replaces KillWait."""
        if self.rec.ending or self.ended.is_set():
            return
        self.rec = self.records.update(*self.key, ending="timed_out" if timed_out else "killed")
        self._request_kill(self.kill_wait if grace_s is None else grace_s)

    def _request_kill(self, grace: float) -> None:
        if self.supervisor_alive() and self.rec.supervisor > 0:
            with contextlib.suppress(OSError):
                if killseq.request(str(self.run_dir), grace, self.rec.supervisor):
                    return
        # No supervisor to do it (it vanished): what is left of the script goes now.
        self.signal(signal.SIGKILL)


def batch_spec(
    order: LaunchOrder, run_dir: Path, env: dict[str, str], cgroup: str | None, owner: JobUser
) -> StepSpec:
    """The batch step as the supervisor (``stepd.py``) runs it: one task, the script, in the submit
    directory, with its output files (opened as the owner), in the run's cgroup (which it owns), as the
    job's owner."""
    spec = order.spec
    stdout_path, stderr_path = output_paths(order)
    append = spec.open_mode == "append"
    return StepSpec(
        user=order.user,
        key="",
        job_id=order.job_id,
        attempt=order.attempt,
        step_id=BATCH_STEP,
        tasks=[
            TaskSpec(
                task=0,
                argv=[str(run_dir / "script"), *spec.argv],
                cwd=spec.workdir,
                env=env,
                stdout=OutputTarget(path=stdout_path, append=append),
                stderr=OutputTarget(path=stderr_path, append=append) if stderr_path else None,
            )
        ],
        cgroup_procs=None if cgroup is None else os.path.join(cgroup, memcg.PROCS),
        batch=True,
        run_as=owner.run_as(),
    )


async def start(
    order: LaunchOrder,
    run_dir: Path,
    base_env: dict[str, str],
    records: Records,
    kill_wait: float,
    cgroup: str | None = None,
    reached: Callable[[str], None] = lambda point: None,
    step_signaller: StepSignaller | None = None,
    clock: Clock | None = None,
    *,
    owner: JobUser,
    supervisors: Supervisors | None = None,
    node: NodeEnv | None = None,
) -> Run:
    """Start the batch script under its supervisor (in the memory cgroup ``cgroup``, if any: see
    confine.py), as the job's ``owner``, and record it; LaunchError says why it could not be.

    ``base_env`` is the owner's login basics (``jobenv.base_environment``), ``node`` what the node adds to
    the job's environment (its TMPDIR, made already: ``runtmp.py``). The script is the owner's
    (0700) in a run directory others may only traverse (0711), so the owner can execute it and nobody else
    read it; its output files are opened by the script's process, as the owner, so a file or directory
    the owner may not write is a launch error naming it (``taskstart.OUTPUT_ERROR``)."""
    spec = order.spec
    if not os.path.isdir(spec.workdir):
        raise LaunchError(f"cannot chdir to {spec.workdir}: no such directory")
    run_dir.mkdir(mode=0o711, parents=True, exist_ok=True)
    script = run_dir / "script"
    fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o700)
    with os.fdopen(fd, "w") as fh:
        fh.write(spec.script)
        os.fchmod(fh.fileno(), 0o700)
        if owner.switch:
            os.fchown(fh.fileno(), owner.uid, owner.gid)
    env = job_environment(order, base_env, owner.uid, owner.gid, node)
    sdir = StepDir.batch(run_dir, order.job_id, order.attempt)
    sdir.write_spec(batch_spec(order, run_dir, env, cgroup, owner))
    log = os.open(run_dir / "stepd.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        # The one supervisor of every step (stepd.py), detached in its own session so it outlives us. A
        # new interpreter gets the job's environment (it carries the job's identity, as the job's
        # processes do); a forked one the fork server's.
        proc = await (supervisors or Supervisors(run_dir, fork=False)).start(run_dir, log, None, env)
    except OSError as exc:
        raise LaunchError(f"cannot start the job's supervisor: {exc.strerror}") from None
    finally:
        os.close(log)
    reached("launch.supervisor_started")  # (failure tests: crashpoints.py)
    try:
        line = (await asyncio.wait_for((await proc.reader()).readline(), HANDSHAKE_S)).decode().strip()
    except TimeoutError:
        line = "error the job's supervisor did not answer"
    finally:
        proc.close_stdout()  # nothing more to read: its end is seen on its pidfd, its outcome on disk
    pids = sdir.pids() if line == "ok" else None
    if pids is None or "0" not in pids.tasks:
        # No script: the supervisor's own failure, or the script's start (its exit file says why).
        failed = sdir.exit_of(0, order.node)
        proc.kill()
        await proc.wait()
        why = failed.error if failed is not None and failed.error else line.removeprefix("error ")
        if failed is not None and why.startswith(taskstart.OUTPUT_ERROR):
            raise LaunchError(why)  # it names the file and what is wrong with it
        raise LaunchError(f"cannot execute the batch script: {why}" if failed else why or "no supervisor")
    # (lost with the machine, the supervisor is gone too: adopted as vanished, records.py)
    pid, started = pids.tasks["0"][0], pids.stepd[1]
    rec = records.note(order.job_id, order.attempt, pid=pid, supervisor=proc.pid, supervisor_start=started)
    return Run(rec, run_dir, records, kill_wait, proc, step_signaller, clock)


def adopt(
    rec: Record,
    run_dir: Path,
    records: Records,
    kill_wait: float,
    step_signaller: StepSignaller | None = None,
    clock: Clock | None = None,
) -> Run:
    """The run of a record a previous agent process left unreported (its supervisor may be alive or not).

    A record without a supervisor (the agent died between starting it and recording the handshake) is
    completed from the supervisor's pids file. A ``killed`` file in the run directory (written by whoever
    killed the run while the agent was down: ``corral up``'s stop) makes it a kill.
    """
    if not rec.supervisor:
        pids = read_pids(run_dir)
        if pids is not None:
            sup, ticks, pid = pids
            rec = records.update(rec.job_id, rec.attempt, supervisor=sup, supervisor_start=ticks, pid=pid)
    if not rec.ending and (run_dir / KILLED_FILE).exists():
        rec = records.update(rec.job_id, rec.attempt, ending="killed")
    return Run(rec, run_dir, records, kill_wait, step_signaller=step_signaller, clock=clock)
