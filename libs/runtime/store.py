"""PostgreSQL access for the read models: an asyncpg pool, numbered SQL migrations, error triage.

- ``create_pool(dsn)`` opens a pool (asyncpg, no ORM).
- ``migrate(pool)`` applies numbered migrations (a package's ``migrations/NNN_name.sql`` files) in order,
  one transaction each, and records them in ``schema_migrations`` (version, name, checksum). It is
  idempotent and safe to run from several processes at once: a session advisory lock serialises
  the runners, and a runner that waited finds the work done. An applied file whose text changed
  is refused (``StoreError``): fix forward with a new migration instead.
- ``is_transient(exc)`` / ``is_bad_data(exc)`` sort database errors for a consumer: retry later
  (connection lost, server shutting down, serialisation failure) vs a value the database cannot
  store (it would fail forever).

Errors::

    StoreError      the migrations on disk and in the database disagree
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.resources
import re
from dataclasses import dataclass
from typing import Any, TypeAlias

import asyncpg

#: asyncpg has no type information; these name what a value is where it is passed around.
Pool: TypeAlias = Any
Connection: TypeAlias = Any

#: Key of the advisory lock that serialises migration runners (any constant unique to Corral).
MIGRATION_LOCK = 0x636F7272616C  # "corral"

_FILE = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")

# SQLSTATE classes that mean "try again later": connection exception, transaction rollback
# (serialisation failure, deadlock), insufficient resources, operator intervention (shutdown,
# cannot connect now), system error.
_TRANSIENT_CLASSES = frozenset({"08", "40", "53", "57", "58"})


class StoreError(Exception):
    """The database's migration history does not match the migration files."""


@dataclass(frozen=True)
class Migration:
    """One numbered SQL file."""

    version: int  # NNN of the file name; applied in increasing order
    name: str  # the rest of the file name
    sql: str  # the statements
    checksum: str  # sha256 of the text, to notice an applied file that was edited


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 10) -> Pool:
    """An asyncpg connection pool for ``dsn`` (a ``postgresql://`` URL)."""
    return await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, command_timeout=60)


def migrations(package: str, directory: str = "migrations") -> list[Migration]:
    """The migration files packaged in ``package``'s ``directory``, by version; StoreError for a misnamed
    or duplicate file."""
    found: dict[int, Migration] = {}
    for item in importlib.resources.files(package).joinpath(directory).iterdir():
        if not item.name.endswith(".sql"):
            continue
        match = _FILE.match(item.name)
        if match is None:
            raise StoreError(f"migration file {item.name!r} is not named NNN_name.sql")
        version = int(match.group(1))
        if version in found:
            raise StoreError(f"two migration files have version {version:03d}")
        sql = item.read_text(encoding="utf-8")
        checksum = hashlib.sha256(sql.encode()).hexdigest()
        found[version] = Migration(version, match.group(2), sql, checksum)
    return [found[v] for v in sorted(found)]


async def migrate(pool: Pool, files: list[Migration]) -> list[int]:
    """Apply the migrations the database lacks, in order; returns the versions applied now."""
    async with pool.acquire() as conn:
        await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK)
        try:
            return await _apply_missing(conn, files)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK)


async def _apply_missing(conn: Connection, files: list[Migration]) -> list[int]:
    await conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,"
        " applied_at timestamptz NOT NULL DEFAULT now())"
    )
    rows = await conn.fetch("SELECT version, checksum FROM schema_migrations")
    applied = {int(row["version"]): str(row["checksum"]) for row in rows}
    done: list[int] = []
    for migration in files:
        if migration.version in applied:
            if applied[migration.version] != migration.checksum:
                raise StoreError(
                    f"migration {migration.version:03d}_{migration.name} was edited after it was applied;"
                    " add a new migration instead"
                )
            continue
        async with conn.transaction():
            await conn.execute(migration.sql)
            await conn.execute(
                "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                migration.version,
                migration.name,
                migration.checksum,
            )
        done.append(migration.version)
    return done


def is_transient(exc: BaseException) -> bool:
    """Whether the same database work may succeed later (retry) rather than fail forever."""
    if isinstance(exc, asyncpg.PostgresError):
        return _sqlstate_class(exc) in _TRANSIENT_CLASSES
    if _client_refused(exc):
        return False
    return isinstance(exc, OSError | asyncio.TimeoutError | asyncpg.InterfaceError)


def is_bad_data(exc: BaseException) -> bool:
    """Whether the database refused a value (out of range, NUL in text, ...): retrying cannot help."""
    if _client_refused(exc):
        return True
    return isinstance(exc, asyncpg.PostgresError) and _sqlstate_class(exc) == "22"


def _sqlstate_class(exc: BaseException) -> str:
    return str(getattr(exc, "sqlstate", "") or "")[:2]


def _client_refused(exc: BaseException) -> bool:
    # asyncpg's client-side DataError (an argument it cannot encode, e.g. an int beyond int64) is an
    # InterfaceError and a ValueError; its public name is shadowed by the server's SQLSTATE 22000 class.
    return isinstance(exc, asyncpg.InterfaceError) and isinstance(exc, ValueError)
