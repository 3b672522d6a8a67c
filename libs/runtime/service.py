"""Running a service process: flags, settings, logging, signals, clean shutdown.

``run(name, main)`` parses ``--credentials`` and ``--config`` (falling back to the settings from
the environment), configures telemetry, serves the process's Prometheus metrics on ``--metrics-port``
(``metrics.py``; ``off`` serves and records none), connects to NATS with the role's credentials and runs
``main(ctx)`` until SIGINT/SIGTERM sets ``ctx.stop``. A service's long-lived loops run under
``run_until_stopped``: the first one that fails stops the service with a logged error and exit status 1,
so a crashed loop is never a silently half-dead service (systemd's ``Restart=always`` restarts it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from corral.libs.config import otlp
from corral.libs.config import settings as settings_mod
from corral.libs.config.cluster import ClusterConfig, ConfigError, load_config
from corral.libs.runtime import bus as busmod
from corral.libs.runtime import metrics as metricsmod
from corral.libs.runtime import streams, telemetry
from corral.libs.runtime.credentials import Credentials, read_credentials
from corral.libs.runtime.nats_link import Link


@dataclass
class Context:
    """What a service's main coroutine gets."""

    name: str  # service name
    nc: Client  # the NATS connection
    bus: busmod.Bus  # the log
    config: ClusterConfig  # the cluster configuration
    args: argparse.Namespace  # parsed command line (service-specific flags included)
    settings: settings_mod.Settings  # environment settings
    stop: asyncio.Event = field(default_factory=asyncio.Event)  # set on SIGINT/SIGTERM
    metrics: metricsmod.Metrics | None = None  # the process's metrics (None: --metrics-port off)
    link: Link | None = None  # the connection's drops and returns, for the loops that watch them


async def either(first: asyncio.Event, second: asyncio.Event) -> None:
    """Return when either event is set."""
    waiters = [asyncio.ensure_future(first.wait()), asyncio.ensure_future(second.wait())]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def run_until_stopped(stop: asyncio.Event, *loops: Coroutine[Any, Any, None]) -> None:
    """Run a service's loops until ``stop`` is set; if one raises first, set ``stop``, end the others and
    raise its error. Each loop is cancelled once the service stops (it may also return on its own when
    it sees ``stop``)."""
    tasks = [asyncio.create_task(loop) for loop in loops]
    stopper = asyncio.create_task(stop.wait())
    try:
        pending = {*tasks, stopper}
        while not stop.is_set():
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            failed = [t for t in done if t is not stopper and not t.cancelled() and t.exception()]
            if failed:
                error = failed[0].exception()
                assert error is not None
                raise error
            if not pending - {stopper}:
                break
    finally:
        stop.set()
        for task in (*tasks, stopper):
            task.cancel()
        await asyncio.gather(*tasks, stopper, return_exceptions=True)


def parser(name: str) -> argparse.ArgumentParser:
    """The common flags of every service."""
    p = argparse.ArgumentParser(prog=f"corral-{name}", description=f"Corral {name} service")
    p.add_argument("--credentials", type=Path, help="role credentials file (env CORRAL_CREDENTIALS)")
    p.add_argument("--config", type=Path, help="cluster TOML (env CORRAL_CLUSTER_CONFIG)")
    p.add_argument(
        "--metrics-port",
        help="Prometheus metrics port; 0 picks a free one (the default), off or -1 disables "
        "(env CORRAL_METRICS_PORT)",
    )
    p.add_argument(
        "--metrics-addr",
        help=f"address of the metrics port (env CORRAL_METRICS_ADDR; default {settings_mod.METRICS_ADDR})",
    )
    return p


def _fail(name: str, message: str) -> int:
    print(f"corral-{name}: error: {message}", flush=True)
    return 2


def run(
    name: str,
    main: Callable[[Context], Coroutine[Any, Any, None]],
    argv: Sequence[str] | None = None,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> int:
    """Entry point of a service process; returns the exit status."""
    p = parser(name)
    if extra is not None:
        extra(p)
    args = p.parse_args(argv)
    env = settings_mod.from_env()
    creds_path = args.credentials or env.credentials
    config_path = args.config or env.cluster_config
    if creds_path is None or config_path is None:
        return _fail(
            name, "--credentials and --config (or CORRAL_CREDENTIALS, CORRAL_CLUSTER_CONFIG) are required"
        )
    try:
        creds = read_credentials(creds_path)
        config = load_config(config_path)
        port = settings_mod.metrics_port(args.metrics_port or env.metrics_port)
    except (ValueError, ConfigError) as exc:
        return _fail(name, str(exc))
    if env.nats_url:
        creds = Credentials(url=env.nats_url, user=creds.user, password=creds.password)
    try:
        target = otlp.target(env)
        if target is not None:
            otlp.export_delay(env)  # the batch processors read it too: refuse a bad one here, by name
    except ConfigError as exc:
        return _fail(name, str(exc))
    telemetry.configure(name, target)
    metrics: metricsmod.Metrics | None = None
    endpoint: metricsmod.Endpoint | None = None
    if port is not None:
        metrics = metricsmod.Metrics()
        addr = args.metrics_addr or env.metrics_addr or settings_mod.METRICS_ADDR
        try:
            endpoint = metricsmod.serve(metrics, addr, port)
        except OSError as exc:
            return _fail(name, f"cannot serve metrics on {addr}:{port} (--metrics-port): {exc}")
    try:
        return asyncio.run(_serve(name, main, creds, config, args, env, metrics, endpoint))
    finally:
        if endpoint is not None:
            endpoint.stop()


async def _serve(
    name: str,
    main: Callable[[Context], Coroutine[Any, Any, None]],
    creds: Credentials,
    config: ClusterConfig,
    args: argparse.Namespace,
    env: settings_mod.Settings,
    metrics: metricsmod.Metrics | None = None,
    endpoint: metricsmod.Endpoint | None = None,
) -> int:
    log = telemetry.logger()
    if endpoint is not None:
        log.info("metrics served", url=endpoint.url)
    # The request servers this process starts (api_server.serve) record into its metrics.
    metricsmod.current.set(metrics)
    link = Link(f"corral-{name}")
    nc = await streams.connect(creds, name=f"corral-{name}", link=link)
    bus = busmod.Bus(nc, actor=creds.user, metrics=metrics)
    ctx = Context(name, nc, bus, config, args, env, metrics=metrics, link=link)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, ctx.stop.set)
    task = asyncio.create_task(main(ctx))
    stopper = asyncio.create_task(ctx.stop.wait())
    gone = asyncio.create_task(link.gone.wait())
    log.info("started")
    await asyncio.wait({task, stopper, gone}, return_when=asyncio.FIRST_COMPLETED)
    # A connection nats-py closed for good (the server refused it: a rotated password) is not coming back:
    # exit non-zero, for the supervisor (corral up, systemd) to start the service with its new credentials.
    lost = gone.done() and not ctx.stop.is_set()
    ctx.stop.set()
    gone.cancel()  # (the connection is still open on a stop: nothing to wait for, it is drained below)
    for t in (task, stopper):
        if not t.done():
            # Its error, if any, is reported below (a failed loop sets ``stop`` before main raises it).
            with contextlib.suppress(Exception):
                try:
                    await asyncio.wait_for(t, timeout=10)
                except (TimeoutError, asyncio.CancelledError):
                    t.cancel()
    status = 0
    if lost:
        log.error("nats connection closed by the server", error=repr(nc.last_error))
        status = 1
    if task.done() and not task.cancelled() and task.exception() is not None:
        log.error("service failed", exc_info=task.exception())
        status = 1
    with contextlib.suppress(Exception):
        await nc.drain()
    log.info("stopped")
    return status
