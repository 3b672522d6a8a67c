"""The node agent (slurmd): registers its node, heartbeats, and runs the orders for its node.

Cycle:
1. register: append ``NodeRegistered`` with the node's inventory (``registration.py``);
2. reconcile: runs recorded as launched but never reported are re-adopted (``work.py``): each batch script
   runs under a detached supervisor (runner.py, stepd.py) that outlives the agent, so a run still alive
   is supervised again (time limit included) and one that ended meanwhile is reported with its exit status;
   then the step directories a previous agent left are re-adopted (``steps.py``);
3. heartbeat on ``corral.hb.<node>`` every interval (not an event);
4. consume ``corral.work.<node>`` durably, in order (``work.py``): a launch starts the batch script (at most
   once per (job, attempt)), a kill starts the kill sequence, a signal reaches the run's processes;
5. report ``RunStarted`` and, when the script ends, ``RunExited`` (``reporting.py``);
6. answer ``srun``'s step requests (``step_server.py`` and the step modules it serves, see ``steps.py``).

``main`` is the composition root: it builds each part once, hands each the narrow interfaces it needs
(``step_state.RunsView``, ``step_state.Appender``, ``work.RunSteps``...), and runs them.

Stopping the agent (SIGTERM) leaves its jobs running; the next agent process re-adopts them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from corral.libs.config.settings import environment
from corral.libs.runtime import telemetry
from corral.libs.runtime.service import Context, run_until_stopped
from corral.schemas import subjects
from corral.services.agent import confine, inventory
from corral.services.agent.background import Background
from corral.services.agent.crashpoints import CrashPoints
from corral.services.agent.healthcheck import health_checks
from corral.services.agent.identity import Identities
from corral.services.agent.jobenv import NodeEnv, topology_address
from corral.services.agent.metrics import AgentMetrics
from corral.services.agent.registration import Registration
from corral.services.agent.reporting import Reporter
from corral.services.agent.runs import Runs
from corral.services.agent.runtmp import RunTmp
from corral.services.agent.step_cgroups import StepCgroups
from corral.services.agent.step_coord import StepCoord
from corral.services.agent.step_local import StepLocal
from corral.services.agent.step_output import StepOutput
from corral.services.agent.step_server import StepServer
from corral.services.agent.step_state import StepTable
from corral.services.agent.steps import Steps
from corral.services.agent.supervisor import Supervisors
from corral.services.agent.work import Work


def run_tmp(ctx: Context, name: str, runs: Runs, log: Any) -> RunTmp:
    """Each run's TMPDIR on this node, and the rest of what the node adds to its jobs' environments: the
    cluster's configuration file (SLURM_CONF) and the node's topology address."""
    config = ctx.config
    conf = os.path.abspath(config.source) if os.path.isfile(config.source) else None
    env = NodeEnv(conf=conf, topology=topology_address(name, config.block_map()))
    base = Path(config.tmpdir_base) if config.tmpdir_base else None
    return RunTmp(base, runs.cgroups.tag, name, runs.records, log, env)


def build_steps(
    ctx: Context,
    name: str,
    state_dir: Path,
    runs: Runs,
    reporter: Reporter,
    crash: CrashPoints,
    identities: Identities,
    tmp: RunTmp,
) -> Steps:
    """The node's step parts, each handed what it needs of the others and of the runs table."""
    nc, kill_wait = ctx.bus.nc, ctx.config.kill_wait_s
    root = state_dir / "stepd"  # step directories (stepdir.py)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    table, background = StepTable(), Background()
    cgroups = StepCgroups(
        run_cgroup=runs.run_cgroup, create=runs.create_cgroup, remove=runs.remove_peer_cgroup
    )
    output = StepOutput(nc, name, table, cgroups, background)
    local = StepLocal(
        nc,
        name,
        root,
        kill_wait,
        table,
        cgroups,
        output,
        crash,
        background,
        identities,
        tmp,
        runs.supervisors,
    )
    coord = StepCoord(
        nc, name, root, state_dir / "steps", kill_wait, runs, reporter, table, local, background
    )
    server = StepServer(nc, name, runs, table, local, coord, background)
    return Steps(name, root, runs, table, local, coord, server, background)


async def main(ctx: Context) -> None:
    """Register, reconcile, then heartbeat and execute orders until stopped."""
    name = ctx.args.node
    try:
        node = ctx.config.node(name)
    except KeyError:
        raise SystemExit(f"corral-agent: error: node {name!r} is not in {ctx.config.source}") from None
    # Absolute: run and step directories are handed to processes that start elsewhere.
    state_dir = Path(ctx.args.state_dir or ctx.settings.state_dir / "agents" / name).absolute()
    crash = CrashPoints(ctx.args.crash_at)
    log = telemetry.logger(node=node.name)
    identities = Identities(node.name, ctx.config.allow_root_jobs)
    supervisors = Supervisors(state_dir, log)  # the supervisors' fork server's (its log is there)
    runs = Runs(
        state_dir, confine.RunCgroups.probe(ctx.config, node, state_dir, log), supervisors, crash=crash
    )
    if os.geteuid() == 0 and (closed := runs.closed_to_users()) is not None:
        log.warning(
            "job owners cannot reach their scripts: a job of a user other than root will fail to execute it",
            directory=str(closed),
            fix=f"chmod o+x {closed}",
        )
    metrics = AgentMetrics(ctx.metrics.registry, node.name) if ctx.metrics is not None else None
    reporter = Reporter(ctx.bus, node.name, runs.records, log, metrics)
    tmp = run_tmp(ctx, name, runs, log)
    steps = build_steps(ctx, name, state_dir, runs, reporter, crash, identities, tmp)
    work = Work(
        node.name,
        ctx.config,
        runs,
        reporter,
        steps,
        environment(),
        crash,
        log,
        identities=identities,
        tmp=tmp,
    )
    registration = Registration(ctx.bus, ctx.config, node, inventory.nvml_gpus, log)
    await registration.register()
    await work.reconcile()
    await steps.start()
    try:
        await run_until_stopped(
            ctx.stop,
            registration.heartbeat(ctx.stop),
            health_checks(ctx.nc, name, ctx.config, ctx.stop),
            # The admin created the node's consumer, filtered on its orders (``streams.declare``): bind to it.
            ctx.bus.consume(
                subjects.WORK_STREAM,
                subjects.work_consumer(name),
                subjects.work_subject(name),
                work.handle,
                service=f"agent-{name}",
                batch=16,
                stop=ctx.stop,
                bind=True,
            ),
        )
    finally:
        await steps.stop()
        await work.shutdown()
        supervisors.close()  # the fork server ends after its last supervisor
