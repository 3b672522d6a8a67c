"""Small builders for the scheduler's domain objects: jobs, clusters, envelopes and a log to fold.

Everything is deterministic: times count from ``T0`` and event ids are derived from the content,
so two runs of a test build byte-identical logs. Nothing here reads the clock.
"""

from __future__ import annotations

import hashlib
from typing import Any

from corral.libs.config.cluster import ClusterConfig, parse_config
from corral.libs.core.backfill import Planner
from corral.libs.core.causation import cause_of
from corral.libs.core.fold import apply
from corral.libs.core.placement import Free, Request
from corral.libs.core.policy import PartitionPolicy, Policy
from corral.libs.core.state import State, decode_state, encode_state
from corral.libs.core.timeline import INF
from corral.schemas import codec
from corral.schemas import events as ev

#: The log's epoch in tests (2023-11-14 22:13:20 UTC); every time is an offset from it.
T0 = 1_700_000_000.0

SCRIPT = "#!/bin/bash\nsrun python train.py\n"


def job(
    gpus: int = 8,
    nodes: int = 4,
    *,
    name: str = "train",
    partition: str | None = None,
    gpu_type: str | None = None,
    cpus_per_task: int = 1,
    ntasks: int | None = None,
    ntasks_per_node: int | None = None,
    mem_mb: int | None = None,
    time_s: int | None = None,
    requeue: bool = True,
    **fields: Any,
) -> ev.JobSpec:
    """A batch job of ``nodes`` nodes with ``gpus`` GPUs each; one task per node unless told."""
    return ev.JobSpec(
        name=name,
        script=fields.pop("script", SCRIPT),
        workdir=fields.pop("workdir", "/home/alice/run"),
        partition=partition,
        nodes=nodes,
        ntasks=ntasks if ntasks is not None else nodes * (ntasks_per_node or 1),
        ntasks_per_node=ntasks_per_node,
        cpus_per_task=cpus_per_task,
        mem_per_node_mb=mem_mb,
        gpus_per_node=gpus,
        gpu_type=gpu_type,
        time_limit_s=time_s,
        requeue=requeue,
        **fields,
    )


def node_name(i: int, prefix: str = "gpu") -> str:
    """The i-th node's name (1-based): gpu01, gpu02, ..."""
    return f"{prefix}{i:02d}"


def registered(
    name: str,
    *,
    gpus: int = 8,
    cpus: int = 64,
    mem_mb: int = 512_000,
    gpu_type: str | None = "h100",
    partitions: tuple[str, ...] = ("gpu",),
    features: tuple[str, ...] = (),
) -> ev.NodeRegistered:
    """One node's registration."""
    return ev.NodeRegistered(
        node=name,
        cpus=cpus,
        mem_mb=mem_mb,
        gpus=gpus,
        gpu_type=gpu_type,
        partitions=list(partitions),
        features=list(features),
    )


def cluster(
    nodes: int = 16,
    gpus: int = 8,
    *,
    cpus: int = 64,
    mem_mb: int = 512_000,
    gpu_type: str | None = "h100",
    partitions: tuple[str, ...] = ("gpu",),
    prefix: str = "gpu",
    at: float = T0,
) -> list[ev.Envelope]:
    """Registrations of ``nodes`` identical nodes (gpu01, gpu02, ...), one second apart from ``at``."""
    return [
        env(
            registered(
                node_name(i, prefix),
                gpus=gpus,
                cpus=cpus,
                mem_mb=mem_mb,
                gpu_type=gpu_type,
                partitions=partitions,
            ),
            at=at + i - 1,
            actor="agent",
        )
        for i in range(1, nodes + 1)
    ]


def env(
    body: ev.Event,
    at: float = T0,
    actor: str = "test",
    event_id: str | None = None,
    causation_id: str | None = None,
) -> ev.Envelope:
    """An envelope with a deterministic id (a digest of the body and time) and the given time."""
    if event_id is None:
        event_id = hashlib.blake2b(codec.encode(body) + repr(at).encode(), digest_size=16).hexdigest()
    return codec.envelope(body, actor=actor, occurred_at=at, event_id=event_id, causation_id=causation_id)


def numbered(envelopes: list[ev.Envelope], start: int = 1) -> list[tuple[int, ev.Envelope]]:
    """Log entries (sequence, envelope) numbered from ``start``."""
    return list(enumerate(envelopes, start))


class Log:
    """A log being written: each event gets the next sequence and time and is folded at once."""

    def __init__(self, *envelopes: ev.Envelope) -> None:
        self.state = State()
        self.entries: list[tuple[int, ev.Envelope]] = []
        self.at = T0
        for e in envelopes:
            self.append(e)

    def append(self, envelope: ev.Envelope) -> None:
        """Append an envelope as it is (its own time)."""
        self.at = max(self.at, envelope.meta.occurred_at)
        entry = (len(self.entries) + 1, envelope)
        self.entries.append(entry)
        apply(self.state, *entry)

    def add(self, *bodies: ev.Event, step: float = 1.0) -> State:
        """Append events, each ``step`` seconds after the previous entry; returns the state."""
        for body in bodies:
            self.append(env(body, at=self.at + step))
        return self.state

    def allocation_id(self, job_id: int, attempt: int = 0) -> str:
        """The event id of the allocation of a job's run: the cause its orders name."""
        return next(
            e.meta.event_id
            for _, e in self.entries
            if isinstance(e.body, ev.JobAllocated) and (e.body.job_id, e.body.attempt) == (job_id, attempt)
        )

    def decide(self, decisions: list[ev.Event]) -> None:
        """Append a cycle's decisions as the scheduler does: each with its cause, from the state the cycle
        decided on (``causation.cause_of``)."""
        causes = [cause_of(self.state, d) for d in decisions]
        for body, cause in zip(decisions, causes, strict=True):
            self.append(env(body, at=self.at + 1.0, actor="scheduler", causation_id=cause))


def submitted(job_id: int, spec: ev.JobSpec | None = None, user: str = "alice") -> ev.JobSubmitted:
    """A submission of ``spec`` (default: one node, 8 GPUs)."""
    return ev.JobSubmitted(job_id=job_id, user=user, spec=spec or job(nodes=1))


def allocated(
    job_id: int,
    gpus: dict[str, list[int]],
    *,
    attempt: int = 0,
    cpus: int = 1,
    mem_mb: int = 0,
    partition: str = "gpu",
    time_s: int | None = 3600,
    epoch: int = 0,
) -> ev.JobAllocated:
    """An allocation decision: node name -> GPU indices, in batch-node-first order."""
    return ev.JobAllocated(
        job_id=job_id,
        attempt=attempt,
        partition=partition,
        allocations=[ev.NodeAllocation(node=n, gpus=g, cpus=cpus, mem_mb=mem_mb) for n, g in gpus.items()],
        time_limit_s=time_s,
        epoch=epoch,
    )


def exited(job_id: int, node: str, *, attempt: int = 0, **fields: Any) -> ev.RunExited:
    """The batch script's exit as its node reports it (exit code 0 unless told)."""
    return ev.RunExited(
        job_id=job_id, attempt=attempt, node=node, exit_code=fields.pop("exit_code", 0), **fields
    )


def partition(
    name: str = "gpu", *, default: bool = True, max_s: int | None = None, default_s: int | None = None
) -> PartitionPolicy:
    """A partition of the planner's policy."""
    return PartitionPolicy(name=name, default=default, max_time_s=max_s, default_time_s=default_s)


def policy(*partitions: PartitionPolicy) -> Policy:
    """A policy with these partitions (default: one default partition "gpu", unlimited)."""
    return Policy(partitions=partitions or (partition(),), cluster="test")


def cluster_config(
    nodes: int = 16,
    gpus: int = 8,
    *,
    cpus: int = 64,
    memory: str = "500G",
    gpu_type: str = "h100",
    max_time: str = "1-00:00:00",
    default_time: str = "1:00:00",
    features: tuple[str, ...] = (),
) -> ClusterConfig:
    """A parsed configuration: nodes gpu01.. in default partition "gpu", two CPU nodes in "cpu".

    ``features`` are the GPU nodes' features.
    """
    feature_list = ", ".join(f'"{f}"' for f in features)
    return parse_config(
        f"""
[cluster]
name = "test"

[[nodes]]
names = "gpu[01-{nodes:02d}]"
cpus = {cpus}
memory = "{memory}"
gpus = {gpus}
gpu_type = "{gpu_type}"
features = [{feature_list}]

[[nodes]]
names = "cpu[01-02]"
cpus = 16
memory = "64G"

[[partitions]]
name = "gpu"
nodes = "gpu[01-{nodes:02d}]"
default = true
max_time = "{max_time}"
default_time = "{default_time}"

[[partitions]]
name = "cpu"
nodes = "cpu[01-02]"
"""
    )


def semantic(state: State) -> bytes:
    """A state's bytes without its log positions (last_seq, now): did an entry change anything?"""
    copy = decode_state(encode_state(state))
    copy.last_seq, copy.now = 0, 0.0
    for j in copy.jobs.values():
        j.last_seq = 0
    return encode_state(copy)


def place(free: dict[str, Free], partition: str, req: Request) -> list[ev.NodeAllocation] | None:
    """Start ``req`` in ``partition`` now, as the planner does with nothing reserved (an unlimited run);
    the capacity it takes comes off ``free`` (the planner changes copies: they replace the nodes it took
    from). None if it does not fit."""
    planner = Planner(free, 0.0)
    out = planner.start_now(partition, req, INF)
    for alloc in out or ():
        free[alloc.node] = planner.nodes[alloc.node].free
    return out
