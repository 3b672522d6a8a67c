"""How ``corral demo`` runs the commands and prints: each command as ``$ argv`` and its output under it,
indented and fitted to 80 columns, the demo's own prose wrapped, waits that fail naming what they waited
for; and ``Demo``, what the moments (``demo_moments.py``) play with."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from corral.cli.local_cluster import LocalCluster

#: Every line the demo prints fits in this many columns (an 80-column terminal, with a margin).
WIDTH = 78
#: The indent of a command's output under its ``$ command`` line.
INDENT = "  "
#: Where the commands are (the installation's bin directory; jobs find srun and scontrol there too).
BIN = Path(sys.executable).parent


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
