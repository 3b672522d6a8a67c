"""The runs table of a node: the runs this agent supervises, their records and directories, and what the
steps and the memory cgroups need to know of them.

Run directories are ``<agent state>/jobs/<job>.<attempt>/``; each keeps its launch order (``order.json``,
written before the supervisor starts), so that a run this agent re-adopted after a restart can still
answer srun's step requests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

from corral.libs.runtime.ports import Clock
from corral.schemas import api
from corral.schemas.codec import DecodeError, decode, encode
from corral.services.agent import confine, runner
from corral.services.agent.crashpoints import CrashPoints
from corral.services.agent.records import Records, run_key
from corral.services.agent.supervisor import Supervisors

#: The launch order of a run, kept in its directory (for steps).
ORDER_FILE = "order.json"


class Runs:
    """The runs of this node: live ones by (job, attempt), and their records on disk."""

    def __init__(
        self,
        state_dir: Path,
        cgroups: confine.RunCgroups,
        supervisors: Supervisors | None = None,
        clock: Clock | None = None,
        crash: CrashPoints | None = None,
    ) -> None:
        self.dir = state_dir  # the agent's state directory
        # what was launched and reported, durably, for as long as an order for it may come (records.py)
        self.records = Records(
            state_dir / "runs.jsonl", clock, crash=crash.reached if crash is not None else None
        )
        self.live: dict[tuple[int, int], runner.Run] = {}  # the runs supervised now
        self.cgroups = cgroups  # the node's run memory cgroups
        # starts the runs' and steps' supervisors (the node's fork server; without one, new interpreters)
        self.supervisors = supervisors or Supervisors(state_dir, fork=False)

    def run_dir(self, job_id: int, attempt: int) -> Path:
        """Where a run's script, pids and status files live."""
        return self.dir / "jobs" / f"{job_id}.{attempt}"

    def jobs_dir(self) -> Path:
        """``<agent state>/jobs/``, made traversable and not listable (0711)."""
        jobs = self.dir / "jobs"
        jobs.mkdir(mode=0o711, parents=True, exist_ok=True)
        return jobs

    def make_run_dir(self, job_id: int, attempt: int) -> Path:
        """The run's directory, created traversable and not listable (0711, ``jobs/`` too): the job's user
        executes the script in it (their file, 0700) and may read nothing else there."""
        self.jobs_dir()
        run_dir = self.run_dir(job_id, attempt)
        run_dir.mkdir(mode=0o711, exist_ok=True)
        return run_dir

    def closed_to_users(self) -> Path | None:
        """The first directory from ``/`` down to the run directories that other users may not traverse
        (no o+x), if any: jobs that run as their owners could not execute their scripts (Slurm's
        SlurmdSpoolDir must be 0755 likewise)."""
        jobs = self.jobs_dir().absolute()
        for folder in [*reversed(jobs.parents), jobs]:
            with contextlib.suppress(OSError):
                if not folder.stat().st_mode & stat.S_IXOTH:
                    return folder
        return None

    def remove_run_dir(self, job_id: int, attempt: int) -> None:
        """Remove a run's directory once its exit is recorded as reported: nothing reads it after (its
        supervisor's files were read, its steps ended), and it holds the job's script and environment
        (``order.json``), which stay on no node after the job, as slurmd removes a job's spool directory."""
        shutil.rmtree(self.run_dir(job_id, attempt), ignore_errors=True)

    def sweep_run_dirs(self) -> None:
        """At start: remove the directories of runs reported ended here (an agent that died between the
        report and the removal); those of runs not reported are the adoption's."""
        try:
            names = os.listdir(self.jobs_dir())
        except OSError:
            return
        for key in filter(None, map(run_key, names)):
            record = self.records.get(*key)
            if record is not None and record.exited:
                self.remove_run_dir(*key)

    def keep_order(self, order: api.LaunchOrder) -> None:
        """Keep the run's launch order in its directory (what steps need of the run later, even after an
        agent restart), 0600: it holds the script and the submitter's environment; best effort."""
        with contextlib.suppress(OSError):
            path = self.make_run_dir(order.job_id, order.attempt) / ORDER_FILE
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(encode(order))

    def running_order(self, job_id: int) -> api.LaunchOrder | None:
        """The launch order of the job's run running on this node (its batch node), if any: kept in the
        run's directory at launch, so a run this agent re-adopted after a restart has it too. A run whose
        kill sequence has begun (cancel, time limit, requeue, preemption) is not running any more: its steps
        end with it, as cancelled."""
        keys = [key for key in self.live if key[0] == job_id]
        if not keys or self.live[max(keys)].rec.ending:
            return None
        try:
            data = (self.run_dir(*max(keys)) / ORDER_FILE).read_bytes()
            order: api.LaunchOrder = decode(data, api.LaunchOrder)
        except (OSError, DecodeError):
            return None
        return order

    def latest_attempt(self, job_id: int) -> int:
        """The newest attempt of the job this node has seen (-1: none)."""
        return self.records.latest_attempt(job_id)

    def run_cgroup(self, job_id: int, attempt: int) -> str | None:
        """The run's memory cgroup on this node, if it exists."""
        return self.cgroups.of(self.run_dir(job_id, attempt))

    def create_cgroup(self, order: api.LaunchOrder) -> str | None:
        """Make the run's memory cgroup on this node (None: runs go unconfined)."""
        return self.cgroups.create(order, self.run_dir(order.job_id, order.attempt))

    def remove_peer_cgroup(self, job_id: int, attempt: int) -> None:
        """Remove the run cgroup a peer made for the steps of a run (step_cgroups.py) and its record."""
        run_dir = self.run_dir(job_id, attempt)
        if confine.release(run_dir):
            with contextlib.suppress(OSError):
                (run_dir / confine.CGROUP_FILE).unlink()
                run_dir.rmdir()
