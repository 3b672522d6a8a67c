"""srun's terminal side (pure): labelled output lines, task exit messages and the step's exit status."""

from __future__ import annotations

from corral.schemas.steps import TaskExit


class Labeller:
    """Prefixes every complete output line of a task with ``<task>: `` (``srun -l``), the task id
    right-aligned to the width of the highest one, as Slurm does; partial lines wait for their end."""

    def __init__(self, ntasks: int) -> None:
        self.width = len(str(max(ntasks - 1, 0)))  # digits of the highest task id
        self.partial: dict[tuple[int, str], bytes] = {}  # (task, stream) -> bytes after the last newline

    def feed(self, task: int, stream: str, chunk: bytes) -> bytes:
        """The labelled complete lines of ``chunk`` (and of what was held back before it)."""
        data = self.partial.pop((task, stream), b"") + chunk
        *lines, rest = data.split(b"\n")
        if rest:
            self.partial[(task, stream)] = rest
        prefix = f"{task:>{self.width}}: ".encode()
        return b"".join(prefix + line + b"\n" for line in lines)

    def flush(self, task: int, stream: str) -> bytes:
        """What a task left without a final newline, labelled and ended (at its exit)."""
        rest = self.partial.pop((task, stream), b"")
        return f"{task:>{self.width}}: ".encode() + rest + b"\n" if rest else b""


def exit_message(exit: TaskExit) -> str | None:
    """Slurm's line for a task that did not succeed (None for one that did)."""
    if exit.error:
        return f"{exit.node}: task {exit.task}: {exit.error}"
    if exit.signal:
        return f"{exit.node}: task {exit.task}: Killed by signal {exit.signal}"
    if exit.exit_code:
        return f"{exit.node}: task {exit.task}: Exited with exit code {exit.exit_code}"
    return None


def step_status(exits: list[TaskExit]) -> int:
    """srun's exit status: the worst task's (a task killed by signal S counts as 128+S)."""
    return max((128 + e.signal if e.signal else e.exit_code for e in exits), default=0)
