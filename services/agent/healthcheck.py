"""The agent's health-check program (Slurm's HealthCheckProgram and HealthCheckInterval).

With ``[cluster] health_check_program`` set, each agent runs it at start and every
``health_check_interval`` seconds, as the agent's user (root on a real cluster), with an empty stdin, a
minimal environment and ``CORRAL_NODE`` set, for at most ``TIMEOUT_S`` (or the interval if shorter). A run
that exits non-zero, is killed for taking too long, or prints anything is a failure: the agent publishes a
``fail`` health report (``source = "healthcheck"``, one ``healthcheck`` check with the exit status and the
first line of output) on ``corral.ext.health.agent-<node>.<node>``, the only node its role may report.
Health validates it like any other report and drains the node (``services/health/reports.py``). A passing
run publishes nothing: as in Slurm, a node a health check drained is resumed by an admin.
"""

from __future__ import annotations

import asyncio
import contextlib

import msgspec
from nats.aio.client import Client

from corral.libs.config.cluster import ClusterConfig
from corral.libs.infra import roles
from corral.libs.runtime import telemetry
from corral.schemas import events as ev
from corral.schemas import subjects

#: The longest a health-check program may run before it is killed and counted as failing.
TIMEOUT_S = 60.0
#: Output read from the program (its first line becomes the report's message).
MAX_OUTPUT = 4096


async def run_program(program: str, node: str, timeout: float) -> ev.HealthCheck | None:
    """Run the program once; the failing check it amounts to, or None if it passed."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CORRAL_NODE": node}
    try:
        proc = await asyncio.create_subprocess_exec(
            program,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        return ev.HealthCheck(kind="healthcheck", code="not run", message=f"{program}: {exc.strerror}")
    try:
        output, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return ev.HealthCheck(kind="healthcheck", code="timeout", message=f"{program} ran over {timeout:g}s")
    text = output[:MAX_OUTPUT].decode(errors="replace").strip()
    if proc.returncode == 0 and not text:
        return None
    first = text.splitlines()[0] if text else ""
    code = f"exit {proc.returncode}" if (proc.returncode or 0) >= 0 else f"signal {-(proc.returncode or 0)}"
    return ev.HealthCheck(kind="healthcheck", code=code, message=first[: ev.MAX_NODE_REASON])


async def health_checks(nc: Client, node: str, config: ClusterConfig, stop: asyncio.Event) -> None:
    """Run the health-check program every interval until stopped; report each failure."""
    program = config.health_check_program
    if not program:
        await stop.wait()
        return
    log = telemetry.logger(node=node)
    subject = subjects.health_report_subject(roles.agent_role(node), node)
    timeout = min(TIMEOUT_S, config.health_check_interval_s)
    while not stop.is_set():
        check = await run_program(program, node, timeout)
        if check is not None:
            report = ev.NodeHealthReported(
                node=ev.NodeName(node), source="healthcheck", severity="fail", checks=[check]
            )
            log.warning("health check failed", program=program, code=check.code, message=check.message)
            with contextlib.suppress(Exception):  # the next interval reports again
                await nc.publish(subject, msgspec.json.encode(report))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), config.health_check_interval_s)
