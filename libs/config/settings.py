"""Process settings: the only module that reads the environment.

Every service and command reads its settings once, here, at start; nothing else looks at
``os.environ``.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass
from pathlib import Path


def default_state_dir() -> Path:
    """Where the local cluster keeps its state: ``$CORRAL_STATE_DIR`` or ``~/.corral``."""
    env = os.environ.get("CORRAL_STATE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".corral"


@dataclass(frozen=True)
class Settings:
    """What a service process is told by its environment (command-line flags override)."""

    credentials: Path | None  # CORRAL_CREDENTIALS: the role's credentials file
    cluster_config: Path | None  # CORRAL_CLUSTER_CONFIG: the cluster TOML
    database_url: str | None  # CORRAL_DATABASE_URL: PostgreSQL DSN (accounting)
    nats_url: str | None  # CORRAL_NATS_URL: overrides the URL in the credentials file
    otlp_endpoint: str | None  # OTEL_EXPORTER_OTLP_ENDPOINT: the OTLP base URL (``/v1/traces`` is appended)
    otlp_traces_endpoint: str | None  # OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: the full URL for spans, used as-is
    otlp_headers: str | None  # OTEL_EXPORTER_OTLP_TRACES_HEADERS or ..._HEADERS: ``k=v,k2=v2`` (URL-encoded)
    otlp_protocol: str | None  # OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or ..._PROTOCOL: only http/protobuf
    state_dir: Path  # CORRAL_STATE_DIR or ~/.corral
    unix_user: str  # the user this process runs as
    metrics_port: str | None = None  # CORRAL_METRICS_PORT: the Prometheus port (``metrics_port()`` parses it)
    metrics_addr: str | None = None  # CORRAL_METRICS_ADDR: the address it binds (default 127.0.0.1)
    otel_export_delay: str | None = None  # OTEL_BSP_SCHEDULE_DELAY: ms between two exports (``otlp.py``)


def from_env() -> Settings:
    """Read the settings from the environment."""

    def path(name: str) -> Path | None:
        value = os.environ.get(name)
        return Path(value).expanduser() if value else None

    return Settings(
        credentials=path("CORRAL_CREDENTIALS"),
        cluster_config=path("CORRAL_CLUSTER_CONFIG"),
        database_url=os.environ.get("CORRAL_DATABASE_URL") or None,
        nats_url=os.environ.get("CORRAL_NATS_URL") or None,
        otlp_endpoint=os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None,
        otlp_traces_endpoint=os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or None,
        otlp_headers=_first("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"),
        otlp_protocol=_first("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"),
        state_dir=default_state_dir(),
        unix_user=getpass.getuser(),
        metrics_port=os.environ.get("CORRAL_METRICS_PORT") or None,
        metrics_addr=os.environ.get("CORRAL_METRICS_ADDR") or None,
        otel_export_delay=os.environ.get("OTEL_BSP_SCHEDULE_DELAY", "").strip() or None,
    )


def _first(*names: str) -> str | None:
    """The value of the first of ``names`` that is set and not empty (a signal's own variable first)."""
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


#: The address a service's metrics endpoint binds when none is set.
METRICS_ADDR = "127.0.0.1"
#: The values of a metrics port setting that turn the endpoint off.
METRICS_OFF = ("off", "-1")


def metrics_port(value: str | None) -> int | None:
    """The metrics port a setting names: a port number (0: pick a free one; the default when unset), or
    None for ``off`` / ``-1`` (no endpoint, nothing recorded). ValueError names the setting and the fix."""
    if value is None or value.strip() == "":
        return 0
    text = value.strip().lower()
    if text in METRICS_OFF:
        return None
    if not text.isdigit() or int(text) > 65535:
        raise ValueError(
            f"--metrics-port (CORRAL_METRICS_PORT) must be a port number 0-65535 (0: a free port) "
            f"or 'off', got {value!r}"
        )
    return int(text)


def environment() -> dict[str, str]:
    """A copy of this process's environment (for jobs and child processes)."""
    return dict(os.environ)
