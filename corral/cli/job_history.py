"""One job's log entries, for ``corral trace``: the one place the commands read a job's history.

``job_entries(job_id)`` returns the entries a job's spans are derived from (``libs/trace/derive.py``):
those on its subjects and its steps', its array's submission and whole-array cancels, and the nodes'
``NodeDown`` (the causes of requeues) and ``NodeRegistered`` (their GPUs' type) facts. Today it reads the
log itself, as ``corral log export`` does, with the credentials that command finds
(``log_export.log_credentials``: the admin role of the local cluster, or ``--credentials``), and keeps the
job's entries. A gateway verb that answers a job's history to its owner (and to auditors) can replace the
body of this one function.
"""

from __future__ import annotations

import asyncio

from corral.cli.errors import CliError
from corral.cli.log_export import CONNECT_TIMEOUT_S, log_credentials
from corral.libs.runtime.credentials import Credentials
from corral.schemas import events as ev


def _concerns(body: ev.Event, job_id: int) -> bool:
    """Whether an entry may be about the job (the derivation keeps exactly what counts)."""
    if isinstance(body, ev.NodeDown | ev.NodeRegistered):
        return True
    other = getattr(body, "job_id", None)
    if other is None:
        return False
    if other == job_id:
        return True
    # An array's submission and whole-array cancel are on its first task's subject.
    return other < job_id and isinstance(body, ev.JobSubmitted | ev.JobCancelRequested)


async def _read(creds: Credentials, job_id: int) -> tuple[list[tuple[int, ev.Envelope]], float]:
    import nats

    from corral.libs.runtime.bus import Bus
    from corral.schemas.subjects import inbox_prefix

    async def quiet(exc: Exception) -> None:
        """Connection errors become the one-line error below."""

    try:
        nc = await asyncio.wait_for(
            nats.connect(
                creds.url,
                user=creds.user,
                password=creds.password,
                name="corral-trace",
                inbox_prefix=inbox_prefix(creds.user),
                allow_reconnect=False,
                max_reconnect_attempts=0,
                error_cb=quiet,
            ),
            CONNECT_TIMEOUT_S,
        )
    except Exception as exc:
        raise CliError(f"cannot connect to NATS at {creds.url} as {creds.user}: {exc!r}") from None
    found: list[tuple[int, ev.Envelope]] = []
    last_at = 0.0
    try:
        async for entry in Bus(nc, actor=creds.user).read(1):
            if entry.envelope is None:
                continue
            last_at = max(last_at, entry.envelope.meta.occurred_at)
            if _concerns(entry.envelope.body, job_id):
                found.append((entry.seq, entry.envelope))
    except Exception as exc:
        raise CliError(f"reading the log as {creds.user} failed: {exc!r}") from None
    finally:
        await nc.close()
    return found, last_at


def job_entries(job_id: int, credentials: str | None = None) -> tuple[list[tuple[int, ev.Envelope]], float]:
    """The log entries about job ``job_id`` in log order, and the time of the log's newest entry (how far
    an open span has run); CliError when the log cannot be read."""
    return asyncio.run(_read(log_credentials(credentials), job_id))
