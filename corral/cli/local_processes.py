"""The service processes of a local cluster: started with their log file and environment, watched, killed
and revived by name (for failure tests and ``corral up``'s supervision), and stopped agents first."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Process:
    """One service process of the cluster."""

    name: str  # service name (agent-<node> for agents)
    argv: list[str]  # command line
    proc: subprocess.Popen[bytes] | None = None  # the running process
    secrets: dict[str, str] = field(default_factory=dict)  # environment it gets, never on its command line


class Supervised:
    """What ``LocalCluster`` does with its processes (``processes``, logs under ``state_dir/logs``)."""

    state_dir: Path
    processes: list[Process]

    def _popen(
        self, name: str, argv: list[str], secrets: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        # Services log JSON lines to their own file; they never inherit a job's identity or a remote URL.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CORRAL_"))}
        env["CORRAL_STATE_DIR"] = str(self.state_dir)
        env.update(secrets or {})
        with open(self.state_dir / "logs" / f"{name}.log", "ab") as log:
            return subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )

    def check_alive(self) -> None:
        """Raise if a service process died, with the end of its log (a test's state directory, and the log
        with it, is gone by the time anyone reads the failure)."""
        for p in self.processes:
            if p.proc is not None and p.proc.poll() is not None:
                log = self.state_dir / "logs" / f"{p.name}.log"
                raise RuntimeError(
                    f"{p.name} exited with status {p.proc.returncode}; see {log}; it ends with:\n{_tail(log)}"
                )

    def process(self, name: str) -> Process:
        """The process called ``name``."""
        return next(p for p in self.processes if p.name == name)

    def kill(self, name: str) -> None:
        """Kill a service process hard (SIGKILL), as a crash would (for failure tests)."""
        p = self.process(name)
        assert p.proc is not None
        p.proc.kill()
        p.proc.wait()

    def terminate(self, name: str, timeout: float = 15.0) -> None:
        """Stop a service process cleanly (SIGTERM) and wait for it; an agent leaves its jobs running."""
        p = self.process(name)
        assert p.proc is not None
        p.proc.terminate()
        p.proc.wait(timeout)

    def revive(self, name: str) -> None:
        """Start a killed service process again with the same command line."""
        p = self.process(name)
        p.proc = self._popen(name, p.argv, p.secrets)

    def restart(self, name: str) -> None:
        """Kill a service process hard and start it again."""
        self.kill(name)
        self.revive(name)

    def stop_processes(self, after_agents: Callable[[], None]) -> None:
        """SIGTERM the agents and wait for them (SIGKILL after 15 s), call ``after_agents``, then the same
        for every other process."""
        ordered = sorted(self.processes, key=lambda p: 0 if p.name.startswith("agent-") else 1)
        for group in (
            [p for p in ordered if p.name.startswith("agent-")],
            [p for p in ordered if not p.name.startswith("agent-")],
        ):
            for p in group:
                if p.proc is not None and p.proc.poll() is None:
                    p.proc.send_signal(signal.SIGTERM)
            for p in group:
                if p.proc is None:
                    continue
                try:
                    p.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.proc.kill()
                    p.proc.wait()
            if group and group[0].name.startswith("agent-"):
                after_agents()


def _tail(path: Path, lines: int = 8, limit: int = 4096) -> str:
    """The last ``lines`` lines of a log (of its last ``limit`` bytes), or why there are none."""
    try:
        with open(path, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - limit))
            text = log.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"
