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
the metrics). ``--only N`` plays one moment (``--fast``: the first). The moments are in ``demo_moments.py``;
this module runs the commands and keeps what it prints within 80 columns.
"""

from __future__ import annotations

import getpass
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from corral.cli.local_cluster import LocalCluster

#: Every line the demo prints fits in this many columns (an 80-column terminal, with a margin).
WIDTH = 78
#: The indent of a command's output under its ``$ command`` line.
INDENT = "  "
#: Where the commands are (the installation's bin directory; jobs find srun and scontrol there too).
BIN = Path(sys.executable).parent
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


class DemoError(Exception):
    """A moment did not happen as it should (a job that did not start or end in time)."""


def fit(line: str, indent: str = INDENT, hang: str = "  ") -> list[str]:
    """``line`` under ``indent`` in lines of at most WIDTH columns: wrapped at spaces, continuations indented
    by ``hang`` more (a command's long output line)."""
    if len(indent) + len(line) <= WIDTH:
        return [indent + line]
    lead = indent + " " * (len(line) - len(line.lstrip(" ")))
    return textwrap.wrap(
        line.strip(" "),
        WIDTH,
        initial_indent=lead,
        subsequent_indent=lead + hang,
        break_on_hyphens=False,
    )


def say(text: str) -> None:
    """A paragraph of the demo's own prose, wrapped to WIDTH."""
    for paragraph in text.split("\n"):
        print("\n".join(fit(paragraph, "", "")) if paragraph else "", flush=True)


def heading(title: str) -> None:
    """A section heading: a rule, the title, a rule."""
    print(f"\n{'=' * WIDTH}\n{title}\n{'=' * WIDTH}", flush=True)


@dataclass
class Shell:
    """Runs the cluster's commands as the demo's user, in the demo's job directory, and shows them."""

    env: dict[str, str]  # the commands' environment (CORRAL_STATE_DIR, BIN first on PATH)
    cwd: Path  # where jobs are submitted from and write their output

    def quiet(
        self, *argv: str, stdin: str | None = None, merged: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """Run a command without showing it (polling); ``merged``: its stderr in its stdout, in the order
        written (as a terminal shows them)."""
        program = BIN / argv[0]
        return subprocess.run(
            [str(program) if program.exists() else argv[0], *argv[1:]],
            env=self.env,
            cwd=self.cwd,
            input=stdin,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merged else subprocess.PIPE,
            timeout=120,
            check=False,
        )

    def run(self, *argv: str, stdin: str | None = None) -> str:
        """Run a command as a user would type it: ``$ argv``, then its output, indented and fitted; its
        output (stdout and stderr)."""
        shown = " ".join(a if re.fullmatch(r"[\w./:=,%@+-]+", a) else f"'{a}'" for a in argv)
        self.show(f"$ {shown}", "")
        out = self.quiet(*argv, stdin=stdin, merged=True)
        self.show("", out.stdout.rstrip("\n"))
        if out.returncode != 0:
            raise DemoError(f"{argv[0]} exited with status {out.returncode}")
        return out.stdout

    @staticmethod
    def show(command: str, text: str) -> None:
        """A command line (fitted, no indent) and text under it (indented, fitted)."""
        lines = fit(command, "", "    ") if command else []
        # A table's common left margin (squeue's right-aligned JOBID) is dropped first.
        for line in textwrap.dedent(text).splitlines() if text else []:
            lines += fit(line.rstrip())
        if lines:
            print("\n".join(lines), flush=True)

    def submit(self, *argv: str) -> int:
        """``sbatch <argv>`` shown; the job id."""
        out = self.run("sbatch", *argv)
        found = re.search(r"Submitted batch job (\d+)", out)
        if found is None:
            raise DemoError(f"sbatch did not submit a job: {out!r}")
        return int(found.group(1))

    def state(self, job: int) -> str:
        """The job's state as sacct has it (PENDING, RUNNING, COMPLETED, ...; "" if not yet known)."""
        out = self.quiet("sacct", "-j", str(job), "-X", "-P", "-n", "-o", "State")
        return out.stdout.strip().split(" ")[0] if out.stdout.strip() else ""

    def wait_state(self, job: int, states: tuple[str, ...], timeout: float = 60.0) -> str:
        """Wait until sacct shows the job in one of ``states``; that state."""
        seen = ""

        def reached() -> bool:
            nonlocal seen
            seen = self.state(job)
            return seen in states

        wait_until(reached, timeout, f"job {job} to be {'/'.join(states)} (it is {seen or 'unknown'})")
        return seen


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` every 0.2 s; DemoError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise DemoError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


@dataclass
class Demo:
    """What the moments play with: the cluster, the commands, and the timings so far."""

    cluster: LocalCluster  # the local cluster (a moment kills and revives an agent)
    shell: Shell  # the commands
    resolvable: bool = True  # the node names resolve here (a rendezvous at MASTER_ADDR can work)
    timings: list[tuple[str, float]] = field(default_factory=list)  # (what, seconds), in order

    @property
    def work(self) -> Path:
        """The job directory."""
        return self.shell.cwd


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
        cmdclient.stop_servers(cmdclient.runtime_dir({"XDG_RUNTIME_DIR": str(runtime)}))
        cluster.stop()
        if temporary and not failed:  # a failed demo's logs stay for a look
            shutil.rmtree(state, ignore_errors=True)
