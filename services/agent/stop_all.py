"""What stopping a whole local cluster does to the jobs its agents leave running (``corral up``'s Ctrl-C).

An agent stopped on its own leaves its jobs running for the next agent process to re-adopt; a whole local
cluster that stops kills them, so that nothing of it keeps running. This reads the agents' run and step
directories, which is agent knowledge, so it lives with the agent.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

from corral.services.agent import killseq, memcg, procstat, runtmp


def kill_runs(agents_dir: Path, kill_wait: float) -> int:
    """Kill the runs the node agents under ``agents_dir`` left running; returns how many.

    Each run directory (``<node>/jobs/<job>.<attempt>/``) names its processes in ``pids`` (the supervisor,
    its start ticks, script pid = the job's process group) until its ``status`` is written; a ``killed``
    file written first tells the agent to report the run killed. SIGCONT + SIGTERM to each job's process
    group, SIGKILL to what is left after KillWait. Then no run's memory cgroup (named in ``cgroup``) is left:
    its supervisor removes it as the script ends; one still there a moment later is emptied and removed.
    Last, each agent's directory of run TMPDIRs (``runtmp.py``) goes.
    """
    groups = []
    for pids in agents_dir.glob("*/jobs/*/pids"):
        run_dir = pids.parent
        if (run_dir / "status").exists():
            continue
        try:
            script_pid = int(json.loads(pids.read_text())["tasks"]["0"][0])
        except (OSError, ValueError, IndexError, KeyError, TypeError):
            continue
        (run_dir / "killed").write_text("stopped with the local cluster\n")
        groups.append(script_pid)
        for sig in (signal.SIGCONT, signal.SIGTERM):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(script_pid, sig)
    # srun's tasks run under step supervisors of their own (outside the job's process group).
    steps = step_task_groups(agents_dir)
    for group in steps:
        for sig in (signal.SIGCONT, signal.SIGTERM):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, sig)
    groups += steps
    deadline = time.monotonic() + kill_wait
    while groups and time.monotonic() < deadline:
        groups = [g for g in groups if killseq.group_alive(g)]
        time.sleep(0.1)
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    remove_run_cgroups(agents_dir)
    for marker in agents_dir.glob(f"*/{runtmp.MARKER}"):
        runtmp.remove_all(marker.parent)  # the runs' TMPDIRs, with what the killed jobs left there
    return len(groups)


def step_task_groups(agents_dir: Path) -> list[int]:
    """Process groups of the srun tasks still running under the agents' step supervisors: each step
    directory (``<node>/stepd/<job>.<attempt>.<step>/``) names them in ``pids`` with their start ticks, so a
    pid reused by another process is left alone."""
    groups = []
    for pids in agents_dir.glob("*/stepd/*/pids"):
        try:
            tasks = json.loads(pids.read_text())["tasks"]
            recorded = [(int(pid), int(ticks)) for pid, ticks in tasks.values()]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        groups += [pid for pid, ticks in recorded if procstat.is_running(pid, ticks)]
    return groups


def remove_run_cgroups(agents_dir: Path, wait: float = 3.0) -> None:
    """Remove the memory cgroups the runs under ``agents_dir`` name that still exist, once their supervisors
    had ``wait`` seconds to do it themselves (they read the OOM count first)."""
    cgroups = set()
    for marker in agents_dir.glob("*/jobs/*/cgroup"):
        with contextlib.suppress(OSError):
            cgroups.add(marker.read_text().strip())
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and any(os.path.isdir(c) for c in cgroups):
        time.sleep(0.1)
    for cgroup in cgroups:
        if cgroup and os.path.isdir(cgroup):
            memcg.remove(cgroup)


def crash_runs(agent_dir: Path) -> int:
    """What a node's power loss does to its jobs (``corral demo``'s node death): every step supervisor and
    task process group recorded under one agent's directory (``jobs/*/pids``: batch steps, ``stepd/*/pids``:
    srun's) is killed at once (SIGKILL), then whatever is left in its runs' memory cgroups, which go too (a
    machine that lost power has none left). No ``killed`` marker, no status: the agent started again finds
    its runs vanished. Returns how many recorded processes were killed."""
    killed = 0
    for pids in [*agent_dir.glob("jobs/*/pids"), *agent_dir.glob("stepd/*/pids")]:
        try:
            recorded = json.loads(pids.read_text())
            stepd = (int(recorded["stepd"][0]), int(recorded["stepd"][1]))
            tasks = [(int(pid), int(ticks)) for pid, ticks in recorded["tasks"].values()]
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
            continue
        # The supervisor first: it would report its tasks' deaths.
        for pid, ticks, kill in [(*stepd, os.kill), *((p, t, os.killpg) for p, t in tasks)]:
            if procstat.is_running(pid, ticks):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    kill(pid, signal.SIGKILL)
                    killed += 1
    for marker in agent_dir.glob("jobs/*/cgroup"):
        with contextlib.suppress(OSError):
            cgroup = marker.read_text().strip()
            if cgroup and os.path.isdir(cgroup):
                memcg.remove(cgroup)
    return killed
