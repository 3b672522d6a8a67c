"""Job steps on a node (slurmstepd's part), as the rest of the agent sees them: the agent side of ``srun``.

The parts, one module each, wired in ``app.main``:
- ``step_server.py``: answers ``corral.step.<node>.<caller>`` (srun's and the peer agents' requests);
- ``step_coord.py``: on the job's batch node, numbers and lays out each step, starts its tasks on every
  node, watches it until every task exited (polling peers for lost exits) and signals it everywhere;
- ``step_local.py``: this node's tasks of a step, under a detached supervisor (``stepd.py``) that
  outlives the agent; their signals and kill sequence;
- ``step_output.py``: their output and exits to srun, srun's stdin to task 0;
- ``allocation.py``: the end of an interactive allocation (``AllocationRelease``);
- ``step_state.py``: the table of the node's steps and the interfaces the parts need of the agent.

``Steps`` is what the agent's runs need of them: on start, re-adopt every step directory a previous agent
process left (it tails on from its saved offsets, reports the exits not yet reported, and the batch node
rebuilds the steps it coordinates and keeps watching them) before answering requests; then signal a run's
steps, end a run's steps here, tell whether a run had an OOM step, and which cgroups steps use.
"""

from __future__ import annotations

import os
from pathlib import Path

from corral.libs.runtime import telemetry
from corral.services.agent.background import Background
from corral.services.agent.step_coord import StepCoord
from corral.services.agent.step_local import StepLocal
from corral.services.agent.step_server import StepServer
from corral.services.agent.step_state import COORD_EXITED, Coordinated, RunsView, StepTable
from corral.services.agent.stepdir import StepDir


class Steps:
    """The steps of one node's agent: adopted at start, ended with their runs, left running at stop."""

    def __init__(
        self,
        node: str,
        root: Path,
        runs: RunsView,
        table: StepTable,
        local: StepLocal,
        coord: StepCoord,
        server: StepServer,
        background: Background,
    ) -> None:
        self.root = root  # step directories (stepdir.py)
        self.runs = runs  # the node's runs (the newest attempt seen of a job)
        self.table = table  # the node's steps
        self.local = local  # this node's tasks of steps
        self.coord = coord  # the steps this node coordinates
        self.server = server  # the step request server
        self.background = background  # every step task (cancelled at stop)
        self.log = telemetry.logger(node=node)

    async def start(self) -> None:
        """Re-adopt the steps a previous agent process left, then answer step requests for this node."""
        for sdir in StepDir.all(self.root):
            await self._adopt(sdir)
        # A step of an attempt older than one this node has seen since is stale: its tasks end now (a kill
        # order for it is on its way too; this does not wait for it).
        for key in [k for k in self.table.local if k[1] < self.runs.latest_attempt(k[0])]:
            self.log.info("ending a stale attempt's step", step=key)
            self.local.kill_here(key)
        self.table.ready.set()
        await self.server.start()

    async def _adopt(self, sdir: StepDir) -> None:
        """Take up a step a previous agent process left: follow its tasks (alive or not), and if this node
        coordinates it and its end is not recorded, watch it again."""
        spec = sdir.spec()
        coord = sdir.coord()
        if coord is not None and sdir.marked(COORD_EXITED):
            # Ended under the previous agent process: a launch srun asks again is answered with it.
            self.table.remember_ended(Coordinated.resumed_from(sdir, coord))
            coord = None
        local = self.local.adopt(sdir, spec) if spec is not None else None
        if coord is not None:
            await self.coord.resume(sdir, coord, local)
        if local is None:
            if coord is None:
                sdir.remove()
            return
        self.local.follow_adopted(local)

    def signal_run(self, job_id: int, attempt: int, sig: int, *, everywhere: bool) -> None:
        """Signal the tasks of every step of a run (``scancel -s``, ``--signal``): this node's tasks, or with
        ``everywhere`` (the batch node, which coordinates the run's steps) the tasks on every node. The
        signal is delivered as it is: a SIGKILL here is ``scancel -f -s KILL``, not srun's kill sequence."""
        if everywhere:
            self.coord.signal_run(job_id, attempt, sig)
            return
        for (job, run, step_id), _ in list(self.table.local.items()):
            if (job, run) == (job_id, attempt):
                self.local.signal(job_id, attempt, step_id, sig, raw=True)

    def kill_run_here(self, job_id: int, attempt: int, grace: float) -> None:
        """Start the kill sequence of this node's tasks of every step of a run, not waiting for it."""
        for key in [k for k in self.table.local if k[:2] == (job_id, attempt)]:
            self.local.kill_here(key, grace)

    async def end_run(self, job_id: int, attempt: int, grace: float | None = None) -> None:
        """End this node's processes of a run's steps and wait until they are gone (``StepLocal.end_run``)."""
        await self.local.end_run(job_id, attempt, grace)

    def had_oom(self, job_id: int, attempt: int) -> bool:
        """Whether a step of the run this node coordinates had a task OOM-killed (the job ends OOM)."""
        return self.coord.had_oom(job_id, attempt)

    def cgroups_in_use(self) -> set[str]:
        """The memory cgroups the tasks of this node's step directories joined (kept by the start sweep)."""
        out = set()
        for sdir in StepDir.all(self.root):
            spec = sdir.spec()
            if spec is not None and spec.cgroup_procs:
                out.add(os.path.dirname(spec.cgroup_procs))
        return out

    async def stop(self) -> None:
        """Stop following the steps and leave their tasks running: each runs under its supervisor, and the
        next agent process re-adopts them (``start``). Task 0's stdin (a pipe held here) sees end of file."""
        await self.background.cancel()
