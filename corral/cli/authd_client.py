"""Ask the local ``corral authd`` who we are: the commands' way in when they have no credentials file.

One exchange on its Unix socket: connect, read one JSON line (credentials with a ticket as the password, or
``{"error": ...}``), done. Only builtins and small C modules: every command may import it.
"""

from __future__ import annotations

import _socket

import msgspec

from corral.libs.runtime.credentials import Credentials


class AuthdError(Exception):
    """authd could not be reached or would not vouch for us; the message says which."""


class _Answer(msgspec.Struct, frozen=True):
    url: str = ""
    user: str = ""
    password: str = ""
    expires: float = 0.0
    error: str = ""


def fetch(socket_path: str, timeout: float = 5.0) -> tuple[Credentials, float]:
    """Fresh credentials (a new ticket) from the authd listening on ``socket_path``, and when the ticket
    expires (Unix seconds)."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(socket_path)
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        raise AuthdError(f"cannot reach corral authd at {socket_path}: {exc}") from None
    finally:
        sock.close()
    try:
        answer = msgspec.json.decode(data, type=_Answer)
    except msgspec.DecodeError:
        raise AuthdError(f"corral authd at {socket_path} gave no answer") from None
    if answer.error or not answer.password:
        raise AuthdError(f"corral authd refused: {answer.error or 'no ticket'}")
    return Credentials(url=answer.url, user=answer.user, password=answer.password), answer.expires
