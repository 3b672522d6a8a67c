"""``corral up``'s supervision: a process of the local cluster that dies is started again, with backoff.

A service, an agent, the NATS server or PostgreSQL that exits while the cluster is up is started again with
the same command line (and the same port, for the servers), as systemd's ``Restart=always`` would: the
running jobs are never killed because a service died (an agent that comes back adopts its runs, the
services rebuild from the log). The delay before a restart doubles with each crash from ``BASE_S`` up to
``MAX_S``, and falls back to ``BASE_S`` once the process has stayed up ``STABLE_S``. A process that died
``BURST`` times within ``WINDOW_S`` is reported once with the tail of its log, and the cluster says what is
missing while it keeps trying every ``MAX_S``; the rest of the cluster stays up.

``Backoff`` is the policy, a pure function of the times it is told; ``Supervisor`` applies it to a
``LocalCluster`` and returns the lines to print.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from pathlib import Path

from corral.cli.local_cluster import LocalCluster
from corral.cli.local_processes import Process
from corral.libs.infra.managed import ManagedServer, ServerStartError

#: First delay before starting a dead process again (seconds).
BASE_S = 0.5
#: Longest delay, and the retry period of a process that keeps crashing.
MAX_S = 30.0
#: A process that stayed up this long is healthy again: its next crash waits ``BASE_S``.
STABLE_S = 60.0
#: This many deaths within ``WINDOW_S`` make a crash loop, reported with the log's tail.
BURST = 5
WINDOW_S = 60.0
#: Lines of a crash-looping process's log in its report.
TAIL_LINES = 15


@dataclasses.dataclass
class Backoff:
    """When one process is started again, from the times it died and started."""

    base_s: float = BASE_S
    max_s: float = MAX_S
    stable_s: float = STABLE_S
    burst: int = BURST
    window_s: float = WINDOW_S
    delay_s: float = 0.0  # the delay of the last restart (0: none yet)
    started_at: float = 0.0  # when it was last started
    deaths: collections.deque[float] = dataclasses.field(default_factory=collections.deque)

    def died(self, now: float) -> float:
        """It was found dead at ``now``: the time to start it again."""
        if self.delay_s == 0.0 or now - self.started_at >= self.stable_s:
            self.delay_s = self.base_s
        else:
            self.delay_s = min(self.max_s, self.delay_s * 2)
        self.deaths.append(now)
        while self.deaths and now - self.deaths[0] > self.window_s:
            self.deaths.popleft()
        if self.looping():
            self.delay_s = self.max_s
        return now + self.delay_s

    def started(self, now: float) -> None:
        """It was started at ``now``."""
        self.started_at = now

    def looping(self) -> bool:
        """It died ``burst`` times within ``window_s`` (as of its last death)."""
        return len(self.deaths) >= self.burst


@dataclasses.dataclass
class _Watched:
    """One supervised process: how to tell it is alive, how to start it, where its log is."""

    name: str
    alive: Callable[[], bool]
    start: Callable[[], None]
    status: Callable[[], str]  # how it ended, for the report
    log: Path
    backoff: Backoff = dataclasses.field(default_factory=Backoff)
    restart_at: float | None = None  # dead, to be started then
    reported: bool = False  # its current crash loop was reported


class Supervisor:
    """Restarts the dead processes of ``cluster`` (``tick`` once a second or so)."""

    def __init__(self, cluster: LocalCluster, now: float) -> None:
        self.cluster = cluster
        self.watched: list[_Watched] = []
        for server in (cluster.nats, *cluster.nats_peers):
            if server is not None:
                # Its configuration is rendered again from the credentials files as they are now: a
                # ``corral credentials rotate`` since the start changed the passwords.
                self.watched.append(_server(server, before=cluster.refresh_nats_users))
        if cluster.postgres is not None:
            self.watched.append(_server(cluster.postgres))
        for p in cluster.processes:
            self.watched.append(_service(cluster, p))
        for w in self.watched:
            w.backoff.started(now)

    def tick(self, now: float) -> list[str]:
        """Notice deaths, start what is due; the lines to print."""
        lines: list[str] = []
        for w in self.watched:
            if w.restart_at is None:
                if w.alive():
                    continue
                w.restart_at = w.backoff.died(now)
                delay = w.restart_at - now
                lines.append(f"{w.name} {w.status()}; starting it again in {delay:g} s")
                if not w.backoff.looping():
                    w.reported = False  # out of its crash loop: a new one is reported again
                elif not w.reported:
                    w.reported = True
                    lines.append(_loop_report(w))
                continue
            if now < w.restart_at:
                continue
            try:
                w.start()
            except (ServerStartError, OSError) as exc:
                w.restart_at = w.backoff.died(now)
                lines.append(f"{w.name} could not start ({exc}); trying again in {w.restart_at - now:g} s")
                continue
            w.restart_at = None
            w.backoff.started(now)
            lines.append(f"{w.name} is running again")
        if lines:
            down = self.missing()
            lines.append(f"missing now: {', '.join(down)}" if down else "every process is running")
        return lines

    def missing(self) -> list[str]:
        """The processes that are down now."""
        return [w.name for w in self.watched if w.restart_at is not None]


def _service(cluster: LocalCluster, p: Process) -> _Watched:
    def alive() -> bool:
        return p.proc is not None and p.proc.poll() is None

    def status() -> str:
        return _status(p.proc.returncode if p.proc is not None else None)

    return _Watched(
        name=p.name,
        alive=alive,
        start=lambda: cluster.revive(p.name),
        status=status,
        log=cluster.state_dir / "logs" / f"{p.name}.log",
    )


def _server(server: ManagedServer, before: Callable[[], None] | None = None) -> _Watched:
    def start() -> None:
        if before is not None:
            before()
        server.revive()

    return _Watched(
        name=server.name,
        alive=lambda: server.pid is not None,
        start=start,
        status=lambda: _status(server.returncode),
        log=server.log_path,
    )


def _status(code: int | None) -> str:
    if code is None:
        return "stopped"
    if code < 0:
        return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _loop_report(w: _Watched) -> str:
    try:
        tail = w.log.read_text(errors="replace").splitlines()[-TAIL_LINES:]
    except OSError:
        tail = []
    body = "\n".join(f"    {line}" for line in tail) or "    (its log is empty)"
    return (
        f"{w.name} keeps crashing ({len(w.backoff.deaths)} times in {w.backoff.window_s:g} s); "
        f"the cluster stays up without it and tries again every {w.backoff.max_s:g} s. "
        f"The end of {w.log}:\n{body}"
    )
