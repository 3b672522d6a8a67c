"""Running Corral's Slurm commands against a cluster, as a user would."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent


@dataclass
class Cli:
    """Runs Corral's Slurm commands as a user would, against one cluster."""

    env: dict[str, str]  # environment of the commands (CORRAL_STATE_DIR set)
    workdir: Path  # where jobs are submitted from

    def __call__(
        self, *argv: str, stdin: str | None = None, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run one command; never raises on a non-zero exit."""
        return subprocess.run(
            [str(BIN / argv[0]), *argv[1:]],
            env=self.env,
            cwd=cwd or self.workdir,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def sbatch(self, script: str, *options: str) -> int:
        """Submit a script (on stdin) and return its job id."""
        out = self("sbatch", "--parsable", *options, stdin=script)
        assert out.returncode == 0, out.stderr
        return int(out.stdout.strip())

    def sacct(self, job_id: int, fields: str = "State,ExitCode") -> str:
        """The job row of ``sacct -X -P -n``."""
        out = self("sacct", "-j", str(job_id), "-X", "-P", "-n", "-o", fields)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    def wait_state(self, job_id: int, states: tuple[str, ...], timeout: float = 60.0) -> str:
        """Wait until sacct shows the job in one of ``states``; returns the row."""
        deadline = time.monotonic() + timeout
        row = ""
        while time.monotonic() < deadline:
            row = self.sacct(job_id)
            if row.split("|")[0].split(" ")[0] in states:
                return row
            time.sleep(0.3)
        raise AssertionError(f"job {job_id} did not reach {states} in {timeout}s (last: {row!r})")
