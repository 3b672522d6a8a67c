"""``corral up`` supervises its processes: the scheduler, the gateway, an agent, the NATS server and
PostgreSQL are each killed with SIGKILL while a job runs; each comes back, the job runs on to COMPLETED in
its first attempt, accounting records it, a new job runs afterwards, and Ctrl-C still stops everything."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from e2e_cli import Cli, user_env
from test_up import BIN, processes_using

pytestmark = pytest.mark.e2e

SCRIPT = "#!/bin/bash\necho started\nsleep 40\necho finished\n"


class Up:
    """A running ``corral up`` whose output is collected in a thread."""

    def __init__(self, state: Path, env: dict[str, str], *flags: str) -> None:
        self.proc = subprocess.Popen(
            [
                str(BIN / "corral"),
                "up",
                "--state-dir",
                str(state),
                "--nodes",
                "2",
                "--gpus-per-node",
                "2",
                *flags,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_line(self, text: str, timeout: float = 90.0, after: int = 0) -> int:
        """The index of the first line from ``after`` on that contains ``text``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, line in enumerate(self.lines[after:], start=after):
                if text in line:
                    return i
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"no line with {text!r} from corral up:\n" + "\n".join(self.lines))


def child_pid(parent: int, needle: str) -> int:
    """The pid of ``parent``'s child whose command line contains ``needle``."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and needle in cmd:
            return int(pid)
    raise AssertionError(f"no child of {parent} runs {needle!r}")


def test_killed_processes_come_back_and_the_running_job_lives_on(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = user_env(state)
    cli = Cli(env=env, workdir=tmp_path)
    up = Up(state, env)
    try:
        up.wait_line("is up")
        job = cli.sbatch(SCRIPT, "--gres=gpu:1", "-o", str(tmp_path / "job.out"))
        cli.wait_state(job, ("RUNNING",))
        targets = [
            ("scheduler", "corral.services.scheduler"),
            ("gateway", "corral.services.gateway"),
            ("agent-node1", "--node node1"),
            ("nats-server", "nats.conf"),
            ("postgres", "postgres"),
        ]
        for name, needle in targets:
            old = child_pid(up.proc.pid, needle)
            mark = len(up.lines)
            os.kill(old, signal.SIGKILL)
            up.wait_line(f"{name} was killed by signal 9; starting it again", timeout=30, after=mark)
            up.wait_line(f"{name} is running again", timeout=60, after=mark)
            assert child_pid(up.proc.pid, needle) != old
        up.wait_line("every process is running", after=mark)
        # The job was never requeued: one attempt, completed, and its output is whole.
        assert cli.wait_state(job, ("COMPLETED",), timeout=90) == "COMPLETED|0:0"
        attempts = cli("sacct", "-j", str(job), "-D", "-X", "-n", "-P", "-o", "JobID,State")
        assert attempts.stdout.split() == [f"{job}|COMPLETED"], attempts.stdout
        assert (tmp_path / "job.out").read_text() == "started\nfinished\n"
        # Every service answers again: a new job runs to the end.
        after = cli.sbatch("#!/bin/bash\ntrue\n", "--gres=gpu:1")
        assert cli.wait_state(after, ("COMPLETED",)) == "COMPLETED|0:0"
        assert up.proc.poll() is None
    finally:
        up.proc.send_signal(signal.SIGINT)
        status = up.proc.wait(timeout=90)
        up.reader.join(10)
        assert up.proc.stdout is not None
        up.proc.stdout.close()
    assert status == 0, "\n".join(up.lines)
    assert processes_using(state) == []
