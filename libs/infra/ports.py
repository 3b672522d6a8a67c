"""Free TCP ports for servers we launch ourselves (tests, the embedded cluster).

Asking the kernel for port 0 is the only reliable way to get an unused port; the answer is a hint, not a
reservation, so a caller that binds later can still lose a race and must be ready to retry.
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on `host` that nothing is bound to right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


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
