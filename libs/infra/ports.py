"""Free TCP ports for servers we launch ourselves (tests, the embedded cluster).

A port found free is a hint, not a reservation: a caller that binds later can still lose a race and must be
ready to retry. The race that matters is with the kernel itself: every outgoing connection (each service's
to NATS and PostgreSQL, each test's) takes a local port from the ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``), and a port that ``bind(0)`` hands out comes from that same
range. So a port is picked below it, where only an explicit ``bind`` can take it: CI saw a service exit at
start, unable to bind the metrics port chosen for it a moment before.

A process never gets the same port twice: a local cluster picks every service's metrics port before any of
them binds it, and two random picks among ~22,000 ports collide often enough over a CI run (a cluster's
accounting service exited with status 2 at start, its port given to another service a moment before).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: Where the ephemeral range is; Linux's default when the file is missing (another system).
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL = (32768, 60999)
#: The lowest port picked: above the well-known and the usual servers' (PostgreSQL 5432, NATS 4222, ...).
LOWEST = 10000
#: Ports tried before falling back to one the kernel picks.
TRIES = 64


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (first, last), both included."""
    try:
        first, last = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return first, last


#: The ports this process was given (``free_port`` never gives one twice).
_given: set[int] = set()
#: Picks from the system's entropy: a test or library that seeds ``random`` for itself (hypothesis, a training
#: script's seed_everything) must not make two processes, or two clusters, pick the same ports.
_random = random.SystemRandom()


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on `host` that nothing is bound to right now and that this process was not given
    before, outside the ephemeral range when there is room below it (else one the kernel picks)."""
    first, _ = ephemeral_range()
    if first - LOWEST >= TRIES:
        for port in _random.sample(range(LOWEST, first), TRIES):
            if port not in _given and _bindable(port, host):
                _given.add(port)
                return port
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            chosen: int = sock.getsockname()[1]
        if chosen not in _given:
            _given.add(chosen)
            return chosen


def _bindable(port: int, host: str) -> bool:
    """Whether a listener can bind `host:port` now, and no connection uses it (no SO_REUSEADDR: a port with
    connections in TIME_WAIT is passed over)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Return whether a server could bind `host:port` now.

    SO_REUSEADDR mirrors what nats-server and PostgreSQL set on their listeners, so a port that only has
    connections in TIME_WAIT (a server that just stopped) counts as free.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True
