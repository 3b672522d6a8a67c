"""``corral log export``: write the event log (the JetStream stream) to a file, for ``corral sim`` what-ifs.

    corral log export --out log.jsonl          # the local cluster of ``corral up``
    CORRAL_NATS_URL=nats://ctl:4222 CORRAL_CREDENTIALS=admin.json corral log export > log.jsonl

One JSON line per entry, ``{"seq": N, "envelope": {...}}`` (``corral.libs.sim.eventlog.LogLine``), in
sequence order, read with the scheduler's own reader (``Bus.read``) up to the newest entry at the start.

Reading the log is an operator's act (it holds every user's scripts and environments): users' NATS
accounts may only call the API, so the command connects as a role that may read the stream. Where the
cluster and the credentials are, as the other commands find them:

1. ``--credentials FILE``: that credentials file (``CORRAL_NATS_URL``, if set, overrides its URL);
2. ``CORRAL_NATS_URL`` set: a remote cluster, credentials from ``CORRAL_CREDENTIALS``;
3. otherwise the local cluster: the admin role's file ``<state>/credentials/roles/corral-admin.json``
   (state = ``CORRAL_STATE_DIR`` or ``~/.corral``).

Entries that fail to decode are left out (the fold skips them too) and counted on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

from corral.cli.errors import CliError, run_command
from corral.libs.infra.roles import ADMIN
from corral.libs.runtime.credentials import Credentials, read_credentials

COMMAND = "corral log"
#: Seconds to wait for the connection to the cluster.
CONNECT_TIMEOUT_S = 10.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMMAND, description="Operator tools for Corral's event log.")
    sub = parser.add_subparsers(dest="action", required=True)
    export = sub.add_parser("export", help="write the event log as JSON lines (seq, envelope)")
    export.add_argument("--out", help="file to write (default: standard output)")
    export.add_argument("--credentials", help="credentials file of a role that may read the log")
    return parser


def log_credentials(explicit: str | None, environ: Mapping[str, str] | None = None) -> Credentials:
    """The credentials to read the log with (see the module docstring); CliError naming the file."""
    env = os.environ if environ is None else environ
    remote = env.get("CORRAL_NATS_URL", "").strip()
    if explicit:
        path = Path(explicit).expanduser()
    elif remote:
        text = env.get("CORRAL_CREDENTIALS", "").strip()
        if not text:
            raise CliError(
                "CORRAL_NATS_URL is set but CORRAL_CREDENTIALS is not: set it (or --credentials) to the "
                "credentials file of a role that may read the log"
            )
        path = Path(text).expanduser()
    else:
        state = Path(env.get("CORRAL_STATE_DIR") or "~/.corral").expanduser()
        path = state / "credentials" / "roles" / f"{ADMIN}.json"
    if not path.is_file():
        raise CliError(
            f"no credentials to read the log (no {path}): give --credentials FILE of the admin role, "
            "or run it where 'corral up' keeps its state"
        )
    try:
        creds = read_credentials(path)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return Credentials(url=remote, user=creds.user, password=creds.password) if remote else creds


async def _export(creds: Credentials, out: BinaryIO) -> tuple[int, int, int]:
    """Write every entry; returns (entries written, entries skipped, last sequence)."""
    import nats

    from corral.libs.runtime.bus import Bus
    from corral.libs.sim.eventlog import encode_line
    from corral.schemas.subjects import inbox_prefix

    async def quiet(exc: Exception) -> None:
        """Connection errors become the one-line error below, not a traceback from the client."""

    try:
        nc = await asyncio.wait_for(
            nats.connect(
                creds.url,
                user=creds.user,
                password=creds.password,
                name="corral-log-export",
                inbox_prefix=inbox_prefix(creds.user),
                allow_reconnect=False,
                max_reconnect_attempts=0,
                error_cb=quiet,
            ),
            CONNECT_TIMEOUT_S,
        )
    except Exception as exc:
        raise CliError(f"cannot connect to NATS at {creds.url} as {creds.user}: {exc!r}") from None
    written = skipped = last = 0
    try:
        async for entry in Bus(nc, actor=creds.user).read(1):
            last = entry.seq
            if entry.envelope is None:
                skipped += 1
                continue
            out.write(encode_line(entry.seq, entry.envelope))
            written += 1
    except Exception as exc:
        raise CliError(f"reading the log as {creds.user} failed: {exc!r}") from None
    finally:
        await nc.close()
    return written, skipped, last


def _log(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    creds = log_credentials(args.credentials)
    if args.out is None:
        written, skipped, last = asyncio.run(_export(creds, sys.stdout.buffer))
        sys.stdout.buffer.flush()
    else:
        target = Path(args.out)
        partial = target.with_name(target.name + ".partial")
        try:
            with open(partial, "wb") as out:
                written, skipped, last = asyncio.run(_export(creds, out))
            partial.replace(target)
        except OSError as exc:
            raise CliError(f"{args.out}: cannot write: {exc.strerror}") from None
        finally:
            partial.unlink(missing_ok=True)
    where = "standard output" if args.out is None else args.out
    note = f"; {skipped} entries that failed to decode left out" if skipped else ""
    summary = f"{COMMAND} export: {written} entries (up to sequence {last}) written to {where}{note}"
    print(summary, file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``corral log``."""
    return run_command(COMMAND, _log, argv)
