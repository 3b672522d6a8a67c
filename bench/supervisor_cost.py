"""Benchmark: what one trivial job's processes cost a node: its supervisor, its task, ``/bin/true``.

Usage: ``python bench/supervisor_cost.py [--steps 300] [--no-fork]``.

End to end, every job is a supervisor process (``stepd.py``, forked by the node's fork server,
``stepd_fork.py``) that forks the task, which executes the job's command. This starts supervisors one after
another through the agent's own ``Supervisors`` (the fork server, or with ``--no-fork`` a new interpreter
each), each for a batch step whose one task runs ``/bin/true`` (a step directory and ``step.spec`` written by
``stepdir.StepDir``, a spool file for its output), reads the handshake and the task's exit, and waits for
its end. It prints, per step: the CPU its processes used (the supervisor and what it started, as the
kernel accounts them to the process that reaped them: the fork server, or this process with ``--no-fork``),
split into user and kernel time, their minor page faults, this process's own CPU (the agent's side), and the
wall time. With nothing else running, that CPU is the floor of a trivial job's cost on a node, whatever the
services do: ``2 cores / (ms per step)`` bounds the jobs a second of a 2-core machine. Results are recorded
in ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from corral.services.agent import stepdir
from corral.services.agent.supervisor import Supervisors

TICK = os.sysconf("SC_CLK_TCK")


def reaped(pid: int) -> tuple[float, float, int]:
    """(user s, kernel s, minor faults) of the children ``pid`` has reaped (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[13]) / TICK, int(fields[14]) / TICK, int(fields[8])


def own() -> float:
    """This process's CPU seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run(steps: int, fork: bool, root: Path) -> str:
    supervisors = Supervisors(root / "server", fork=fork)
    (root / "server").mkdir()
    # A job's environment: ~60 variables.
    env = {"PATH": "/usr/bin:/bin", **{f"SLURM_VAR_{i}": "x" * 24 for i in range(60)}}

    async def one(n: int) -> float:
        sdir = stepdir.StepDir(root / "steps", (n, 0, stepdir.BATCH_STEP))
        sdir.path.mkdir(parents=True)
        out = stepdir.OutputTarget(path=str(sdir.spool("out", 0)), private=True)
        task = stepdir.TaskSpec(task=0, argv=["/bin/true"], cwd=str(sdir.path), env=env, stdout=out)
        sdir.write_spec(stepdir.StepSpec(user="bench", key="k", job_id=n, attempt=0, step_id=0, tasks=[task]))
        log = os.open(sdir.path / "stepd.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        started = time.perf_counter()
        try:
            sup = await supervisors.start(sdir.path, log, None, {"PATH": env["PATH"]})
        finally:
            os.close(log)
        reader = await sup.reader()
        lines = [(await reader.readline()).strip() for _ in range(2)]
        assert lines == [b"ok", b"exit 0"], lines
        sup.close_stdout()
        await sup.wait()
        return time.perf_counter() - started

    await one(-1)  # the fork server starts on the first request
    reaper = supervisors.server_pid if fork else os.getpid()
    assert reaper is not None
    await asyncio.sleep(0.2)
    before, mine = reaped(reaper), own()
    walls = [await one(n) for n in range(steps)]
    await asyncio.sleep(0.3)  # the server reaps the last one
    after, mine = reaped(reaper), own() - mine
    user, kernel, faults = ((a - b) / steps for a, b in zip(after, before, strict=True))
    total = (user + kernel) * 1e3
    return (
        f"{'fork server' if fork else 'new interpreter'}: {steps} steps, per step: {total:.2f} ms CPU in the "
        f"supervisor and its task (user {user * 1e3:.2f}, kernel {kernel * 1e3:.2f}), {faults:,.0f} minor "
        f"faults; the launching side {mine / steps * 1e3:.2f} ms CPU; wall p50 "
        f"{statistics.median(walls) * 1e3:.2f} ms. At most {2000 / total:,.0f} such jobs a second on 2 cores."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--no-fork", action="store_true", help="a new interpreter per supervisor")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="corral-supcost-") as tmp:
        print(asyncio.run(run(args.steps, not args.no_fork, Path(tmp))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
