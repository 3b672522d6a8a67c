"""The errors of the synchronous NATS client (``nats_request``), re-exported there.

Error hierarchy::

    NatsRequestError        root; also: connection lost, protocol error, payload too big, any other -ERR
    ├── NatsConnectError    bad URL, TLS asked for, server silent, authentication refused
    │   └── ServerUnreachable   the server's port refused or reset the TCP connection
    ├── NoResponders        the server's 503 status: nobody subscribes to the subject
    ├── RequestTimeout      no reply before the deadline
    └── PermissionDenied    -ERR 'Permissions Violation …': may not publish the subject or subscribe the inbox
"""

from __future__ import annotations


class NatsRequestError(Exception):
    """Root of this module's errors; raised as is for a lost connection or an unexpected server answer."""


class NatsConnectError(NatsRequestError):
    """The connection could not be set up: bad URL, unreachable or silent server, or refused credentials."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot connect to NATS at {url}: {reason}")
        # The server URL, without its password.
        self.url = url
        # What went wrong: the OS error or the server's -ERR text, e.g. "Authorization Violation".
        self.reason = reason

    @classmethod
    def of(cls, url: str, exc: OSError | ValueError) -> NatsConnectError:
        """The error of a login that failed with ``exc`` (a timeout: the server did not answer in time)."""
        silent = isinstance(exc, TimeoutError)
        return cls(url, "the server did not answer in time" if silent else str(exc) or type(exc).__name__)


class ServerUnreachable(NatsConnectError):
    """The server's port refused or reset the TCP connection (a server down or restarting): nothing sent."""


class NoResponders(NatsRequestError):
    """The server answered with status 503: no service subscribes to the subject."""

    def __init__(self, subject: str) -> None:
        super().__init__(f"no Corral service is answering on {subject}: is the cluster running? (corral up)")
        # The subject nobody listens on.
        self.subject = subject


class RequestTimeout(NatsRequestError):
    """No reply arrived before the deadline."""

    def __init__(self, subject: str, timeout: float) -> None:
        super().__init__(f"no reply on {subject} within {timeout:g} s")
        # The subject the request went to.
        self.subject = subject
        # The time waited, in seconds.
        self.timeout = timeout


class PermissionDenied(NatsRequestError):
    """The server refused a publish or a subscription for this user (-ERR 'Permissions Violation …')."""

    def __init__(self, server_error: str) -> None:
        super().__init__(f"NATS refused: {server_error}")
        # The server's text, e.g. 'Permissions Violation for Publish to "svc.submit.bob"'.
        self.server_error = server_error
