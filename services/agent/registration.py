"""A node's presence: ``NodeRegistered`` with its inventory (a new ``boot_id`` per agent process), then a
heartbeat on ``corral.hb.<node>`` (core NATS, not an event) every heartbeat interval.

GPUs come from NVML when a driver is present, else from the cluster config; a GPU count that does not
match the config registers the node drained (``inventory.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

from corral.libs.config.cluster import ClusterConfig, NodeConfig
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.clock import SystemClock
from corral.libs.runtime.ports import Clock
from corral.schemas import events as ev
from corral.schemas import subjects
from corral.services.agent import inventory


class Registration:
    """Registers the node and keeps it known alive."""

    def __init__(
        self,
        bus: Bus,
        config: ClusterConfig,
        node: NodeConfig,
        detect_gpus: inventory.Detector,
        log: Any,
        clock: Clock | None = None,
    ) -> None:
        self.bus = bus
        self.clock = clock or SystemClock()  # the heartbeat's interval
        self.config = config  # the cluster (partitions, heartbeat interval)
        self.node = node  # this node's configuration
        self.detect_gpus = detect_gpus  # the GPUs actually present
        self.log = log

    async def register(self) -> None:
        """Announce the node's inventory."""
        boot = uuid.uuid4().hex
        found = inventory.inventory(self.node, self.detect_gpus)
        if found.drain_reason:
            self.log.warning("registering drained", reason=found.drain_reason)
        await self.bus.append(
            ev.NodeRegistered(
                node=ev.NodeName(self.node.name),
                cpus=self.node.cpus,
                mem_mb=self.node.mem_mb,
                gpus=found.gpus,
                gpu_type=found.gpu_type,
                partitions=self.config.partitions_of(self.node.name),
                features=list(self.node.features),
                boot_id=boot,
                drain_reason=found.drain_reason,
            ),
            msg_id=f"register:{self.node.name}:{boot}",
        )

    async def heartbeat(self, stop: asyncio.Event) -> None:
        """Tell health we are alive, every heartbeat interval."""
        subject = subjects.heartbeat_subject(self.node.name)
        while not stop.is_set():
            with contextlib.suppress(Exception):
                await self.bus.nc.publish(subject, b"")
            await self.clock.sleep(self.config.heartbeat_interval_s, wake=stop)
