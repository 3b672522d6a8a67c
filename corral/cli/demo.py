"""``corral demo``: a local cluster (2 nodes x 4 GPUs), the four moments a GPU cluster team chooses a workload
manager for, played through the real commands, then stop.

1. a multi-node training run from one ``sbatch`` script: its ranks, nodes, GPU indices and ``MASTER_ADDR``;
2. a researcher's interactive ``srun --gres=gpu:N -l``: a torch.distributed gloo all-reduce when torch is
   installed, else a plain multi-task step, its output labelled per task;
3. backfill: a large run waits for the GPUs the scheduler reserves for it (``squeue --start``), a short
   evaluation job slips into the idle GPUs and ends before that start, the large run starts on time;
4. a node dies mid-run: its agent and its job processes are killed, the node goes down, the job is requeued
   gang-wide and resumes from its checkpoint (``SLURM_RESTART_COUNT=1``).

Each moment ends with the commands that show it (squeue, sinfo, sacct, ``corral audit``, ``corral trace``,
the metrics). ``--only N`` plays one moment (``--fast``: the first). This module starts the cluster and plays
the moments (``demo_moments.py``); ``demo_shell.py`` runs the commands and keeps what is printed within 80
columns.
"""

from __future__ import annotations

import getpass
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import structlog

from corral.cli.demo_shell import BIN, INDENT, WIDTH, Demo, DemoError, Shell, fit, heading, say
from corral.cli.local_cluster import LocalCluster

#: The demo cluster's SlurmdTimeout (s): a killed node is declared down this soon (``corral up``'s is
#: 6, the default for other clusters 10).
NODE_TIMEOUT = 4

#: What the demo is about, first.
INTRO = (
    "corral demo: four moments of a GPU cluster's life, through the real Slurm commands (about a minute; "
    "--only N plays one):\n"
    "  1. a multi-node training run   2. an interactive srun\n"
    "  3. backfill                     4. a node dies mid-run"
)


def _environment(state: Path, work: Path) -> dict[str, str]:
    """The demo user's shell: no job's identity, the cluster's state directory, the commands first on
    PATH (the jobs' scripts call srun and scontrol as a user's do), the command server kept in the demo's
    directory (it stops with the demo)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CORRAL_"))}
    env["CORRAL_STATE_DIR"] = str(state)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["XDG_RUNTIME_DIR"] = str(state / "runtime")
    # 2 simulated nodes share this machine's cores: one thread per rank, gloo over loopback.
    env.update({"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "COLUMNS": str(WIDTH - len(INDENT))})
    return env


def run_demo(state_dir: Path | None, only: int | None = None) -> int:
    """Start a local cluster, play the moments (all, or only moment ``only``), stop; the exit status."""
    from corral.cli import cmdclient
    from corral.cli.demo_moments import MOMENTS, closing
    from corral.cli.local_cluster import ensure_resolvable

    # The demo's own NATS connection (declaring the streams) logs its routine close: not for the audience.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    started = time.monotonic()
    temporary = state_dir is None
    state = state_dir or Path(tempfile.mkdtemp(prefix="corral-demo-"))
    cluster = LocalCluster(
        state, getpass.getuser(), nodes=2, gpus_per_node=4, node_timeout=NODE_TIMEOUT, backfill_resolution=1
    )
    config = cluster.prepare()
    warning = ensure_resolvable([n.name for n in config.nodes])
    if warning:
        print("\n".join(fit(f"corral: warning: {warning}", "", "  ")), file=sys.stderr)
    say(INTRO)
    say(f"\nStarting a local cluster: 2 nodes x 4 GPUs (simulated), NATS JetStream, PostgreSQL, in {state}")
    work = state / "demo-jobs"
    runtime = state / "runtime"
    failed = True
    try:
        cluster.start()
        work.mkdir(exist_ok=True)
        runtime.mkdir(mode=0o700, exist_ok=True)
        demo = Demo(cluster, Shell(_environment(state, work), work), resolvable=warning is None)
        demo.timings.append(("cluster start", time.monotonic() - started))
        say(f"Up in {time.monotonic() - started:.1f} s.")
        demo.shell.run("sinfo")
        for number, title, play in MOMENTS:
            if only is not None and number != only:
                continue
            heading(f"{number}/{len(MOMENTS)}  {title}")
            began = time.monotonic()
            play(demo)
            demo.timings.append((f"moment {number}", time.monotonic() - began))
        closing(demo, time.monotonic() - started)
        failed = False
        return 0
    except (DemoError, RuntimeError, TimeoutError, OSError, subprocess.SubprocessError) as exc:
        print(f"corral: error: {exc}; the cluster's logs are in {state}/logs", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("corral: interrupted; stopping the cluster", file=sys.stderr)
        failed = False
        return 130
    finally:
        stopping = time.monotonic()
        cmdclient.stop_servers(cmdclient.runtime_dir({"XDG_RUNTIME_DIR": str(runtime)}))
        cluster.stop()
        if not failed:
            say(f"Stopped in {time.monotonic() - stopping:.1f} s.")
        if temporary and not failed:  # a failed demo's logs stay for a look
            shutil.rmtree(state, ignore_errors=True)
