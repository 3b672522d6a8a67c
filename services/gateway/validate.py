"""Validation of submitted jobs against the cluster (pure): bad input never reaches the log."""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence

import msgspec

from corral.libs.config.cluster import ClusterConfig, PartitionConfig
from corral.libs.core.placement import Free, Request, has_features, node_fits, request_of_spec
from corral.libs.core.topology import block_sizes, fits_idle
from corral.libs.runtime.errors import InvalidInput
from corral.libs.slurm.array import array_indices
from corral.libs.slurm.errors import FormatError
from corral.schemas.events import JobSpec
from corral.schemas.job_spec import (
    MAX_ARGS,
    MAX_DEPENDENCIES,
    MAX_ENV_BYTES,
    MAX_NAME,
    MAX_NODES,
    MAX_SCRIPT_BYTES,
)

#: Slurm's refusal of a partition that does not exist, in its words.
INVALID_PARTITION = "Invalid partition name specified"


def _positive(value: int, name: str, minimum: int = 1) -> None:
    if value < minimum:
        raise InvalidInput(f"{name} must be at least {minimum}, got {value}", field=name)


def validate_spec(spec: JobSpec, config: ClusterConfig) -> None:
    """Raise InvalidInput naming the field if the job can never be accepted on this cluster."""
    _validate_text(spec)
    if not spec.script.startswith("#!"):
        raise InvalidInput("the script must start with #! followed by an interpreter path", field="script")
    if len(spec.script.encode()) > MAX_SCRIPT_BYTES:
        raise InvalidInput(f"script larger than {MAX_SCRIPT_BYTES} bytes", field="script")
    if sum(len(k) + len(v) + 2 for k, v in spec.environment.items()) > MAX_ENV_BYTES:
        raise InvalidInput(f"environment larger than {MAX_ENV_BYTES} bytes", field="environment")
    if not spec.name or len(spec.name) > MAX_NAME or "\n" in spec.name:
        raise InvalidInput(f"job name must be 1-{MAX_NAME} characters on one line", field="name")
    if len(spec.argv) > MAX_ARGS:
        raise InvalidInput(f"at most {MAX_ARGS} script arguments", field="argv")
    if not spec.workdir.startswith("/"):
        raise InvalidInput(f"workdir must be an absolute path, got {spec.workdir!r}", field="workdir")
    _positive(spec.nodes, "nodes")
    _positive(spec.ntasks, "ntasks")
    _positive(spec.cpus_per_task, "cpus_per_task")
    _positive(spec.gpus_per_node, "gpus_per_node", 0)
    if spec.nodes > MAX_NODES:
        raise InvalidInput(f"nodes must be at most {MAX_NODES}", field="nodes")
    if spec.ntasks_per_node is not None:
        _positive(spec.ntasks_per_node, "ntasks_per_node")
    if spec.mem_per_node_mb is not None:
        _positive(spec.mem_per_node_mb, "mem_per_node_mb", 0)
    if spec.time_limit_s is not None:
        _positive(spec.time_limit_s, "time_limit_s")
    for name, value in (("gpus_per_task", spec.gpus_per_task), ("cpus_per_gpu", spec.cpus_per_gpu)):
        if value is not None:
            _positive(value, name)
    _validate_node_choice(spec)
    _validate_topology(spec)
    _validate_partition(spec, config)
    _validate_dependencies(spec)
    array_size(spec)
    if spec.begin_time is not None and not (math.isfinite(spec.begin_time) and spec.begin_time >= 0):
        raise InvalidInput(f"begin_time must be a Unix time, got {spec.begin_time}", field="begin_time")


def _texts(spec: JobSpec) -> list[tuple[str, Sequence[str]]]:
    """Every text of the spec that becomes a file, a path, an argument or an environment entry, by field."""
    optional = {
        "stdout": spec.stdout,
        "stderr": spec.stderr,
        "partition": spec.partition,
        "account": spec.account,
        "qos": spec.qos,
        "reservation": spec.reservation,
        "wckey": spec.wckey,
        "gpu_type": spec.gpu_type,
        "command": spec.command,
    }
    return [
        ("script", [spec.script]),
        ("name", [spec.name]),
        ("workdir", [spec.workdir]),
        ("argv", spec.argv),
        ("environment", [*spec.environment, *spec.environment.values()]),
        *((name, [value]) for name, value in optional.items() if value is not None),
        ("submit_host", [spec.submit_host]),
        ("nodelist", spec.nodelist),
        ("exclude", spec.exclude),
        ("constraint", list(spec.constraint.features) if spec.constraint else []),
    ]


#: Fields that name something (a node, a partition, an account ...): printable text, on one line.
NAMES = frozenset(
    {
        "partition",
        "account",
        "qos",
        "reservation",
        "wckey",
        "gpu_type",
        "submit_host",
        "nodelist",
        "exclude",
        "constraint",
    }
)


def _validate_text(spec: JobSpec) -> None:
    """No NUL byte anywhere: the kernel cannot take one in a path, an argument or the environment, and a
    shell drops the rest of a script line at one, so the job would fail at launch (or run something else).
    No control character in a name: the refusals and the commands' columns show names as they are."""
    for name, texts in _texts(spec):
        for text in texts:
            at = text.find("\0")
            if at >= 0:
                raise InvalidInput(
                    f"{name} contains a NUL byte (character {at}): it must be text; "
                    "remove the \\0 characters",
                    field=name,
                )
            if name in NAMES and not text.isprintable():
                raise InvalidInput(
                    f"{name} {text!r} holds a control character: give a name of printable characters",
                    field=name,
                )


def array_size(spec: JobSpec) -> int:
    """How many jobs the spec makes: its number of array tasks, 1 if it is not an array.

    Raises InvalidInput (field ``array``) for an array out of bounds: more than MaxArraySize (1001) tasks,
    an index above 1000, an empty or malformed range.
    """
    if spec.array is None:
        return 1
    try:
        return len(array_indices(spec.array, "array"))
    except FormatError as exc:
        raise InvalidInput(f"Invalid job array specification: {exc.fix}", field="array") from None


def _validate_dependencies(spec: JobSpec) -> None:
    """Each item names a job (singleton: none); whether those jobs exist is the gateway's check."""
    if spec.dependencies is None:
        return
    items = spec.dependencies.items
    if not items or len(items) > MAX_DEPENDENCIES:
        raise InvalidInput(f"dependencies must hold 1-{MAX_DEPENDENCIES} items", field="dependencies")
    for item in items:
        if (item.type == "singleton") != (item.job_id == 0) or item.job_id < 0:
            raise InvalidInput(
                f"dependency {item.type} with job id {item.job_id}: singleton takes no job id, "
                "the others a positive one",
                field="dependencies",
            )


def _validate_node_choice(spec: JobSpec) -> None:
    """-w, -x and -C are well formed and do not contradict each other."""
    for name, hosts in (("nodelist", spec.nodelist), ("exclude", spec.exclude)):
        if len(hosts) > MAX_NODES or any(not h or len(h) > MAX_NAME for h in hosts):
            raise InvalidInput(f"{name} must hold at most {MAX_NODES} node names", field=name)
    both = sorted(set(spec.nodelist) & set(spec.exclude))
    if both:
        raise InvalidInput(f"node {both[0]} is both required (-w) and excluded (-x)", field="exclude")
    if spec.constraint is not None and (
        not spec.constraint.features or any(not f or len(f) > MAX_NAME for f in spec.constraint.features)
    ):
        raise InvalidInput("constraint must name at least one feature", field="constraint")


def _validate_topology(spec: JobSpec) -> None:
    """--switches and --segment are well formed; the nodes split into whole segments."""
    for name, value, minimum in (
        ("switches", spec.switches, 1),
        ("switches_wait_s", spec.switches_wait_s, 0),
        ("segment", spec.segment, 1),
    ):
        if value is not None:
            _positive(value, name, minimum)
    if spec.segment is not None and spec.nodes % spec.segment:
        raise InvalidInput(
            f"--segment={spec.segment}: the job's {spec.nodes} nodes are not a multiple of the segment size",
            field="segment",
        )


#: Whether a request fits a partition's idle nodes, for one configuration (by identity: a reload makes a new
#: one, and the answers start again) and (partition, request): most submissions of a sweep ask the same, and
#: the check builds every node's capacity. At most ``_FITS_KEPT`` answers are kept.
_fits: tuple[weakref.ref[ClusterConfig], dict[tuple[str, Request], bool]] | None = None
_FITS_KEPT = 4096


def _fits_when_idle(config: ClusterConfig, part: PartitionConfig, req: Request) -> bool:
    """Whether ``req`` fits the idle nodes of ``part`` and their blocks (``topology.fits_idle``)."""
    global _fits
    if _fits is None or _fits[0]() is not config:
        _fits = (weakref.ref(config), {})
    answers = _fits[1]
    key = (part.name, req)
    answer = answers.get(key)
    if answer is None:
        if len(answers) >= _FITS_KEPT:
            answers.clear()
        answer = answers[key] = fits_idle(_idle(config, part), req, config.block_map())
    return answer


def _idle(config: ClusterConfig, part: PartitionConfig) -> list[Free]:
    """The capacity of every node of ``part`` when it is idle."""
    return [
        Free(
            n.name,
            list(range(n.gpus)),
            n.cpus,
            n.mem_mb,
            n.mem_mb,
            n.gpu_type,
            (part.name,),
            features=n.features,
        )
        for n in (config.node(name) for name in part.nodes)
    ]


def _validate_partition(spec: JobSpec, config: ClusterConfig) -> None:
    part = config.partition(spec.partition) if spec.partition else config.default_partition
    if part is None:
        names = ", ".join(p.name for p in config.partitions)
        raise InvalidInput(
            f"{INVALID_PARTITION}: partition {spec.partition!r} does not exist; choose one of {names}",
            field="partition",
        )
    enforce = config.enforce_part_limits != "NO"  # NO: the job pends with the reason instead (plan.py)
    if (
        enforce
        and spec.time_limit_s is not None
        and part.max_time_s is not None
        and spec.time_limit_s > part.max_time_s
    ):
        raise InvalidInput(
            f"time limit {spec.time_limit_s}s exceeds partition {part.name} MaxTime {part.max_time_s}s",
            field="time_limit_s",
        )
    req = request_of_spec(spec)
    # --switches may be dropped after its wait, so only --segment can keep a job from ever running.
    if _fits_when_idle(config, part, msgspec.structs.replace(req, switches=None)):
        return
    all_members = [config.node(name) for name in part.nodes]
    cpus = req.cpus
    idle = _idle(config, part)
    blocks = config.block_map()
    # Name the first field that rules nodes out, then the first dimension no node can satisfy.
    member_names = {n.name for n in all_members}
    missing = [h for h in spec.nodelist if h not in member_names]
    if missing:
        raise InvalidInput(f"node {missing[0]} is not in partition {part.name} (-w)", field="nodelist")
    members = [n for n in all_members if n.name not in req.exclude]
    if not members:
        raise InvalidInput(f"every node of partition {part.name} is excluded (-x)", field="exclude")
    members = [n for n in members if has_features(n.features, req.features, req.any_feature)]
    if not members:
        raise InvalidInput(
            f"no node in partition {part.name} has the features of the constraint (-C)", field="constraint"
        )
    typed = [
        n for n in members if spec.gpu_type is None or spec.gpus_per_node == 0 or n.gpu_type == spec.gpu_type
    ]
    checks = [
        (not typed, "gpu_type", f"no node in partition {part.name} has GPUs of type {spec.gpu_type!r}"),
        (
            max((n.gpus for n in typed), default=0) < spec.gpus_per_node,
            "gpus_per_node",
            f"{spec.gpus_per_node} GPUs per node requested, the largest node in partition {part.name} has "
            f"{max((n.gpus for n in typed), default=0)}",
        ),
        (
            max(n.cpus for n in members) < cpus,
            "cpus_per_gpu" if spec.cpus_per_gpu is not None else "cpus_per_task",
            f"{cpus} CPUs per node requested, the largest node in partition {part.name} has "
            f"{max(n.cpus for n in members)}",
        ),
        (
            max(n.mem_mb for n in members) < (spec.mem_per_node_mb or 0),
            "mem_per_node_mb",
            f"{spec.mem_per_node_mb}M per node requested, the largest node in partition {part.name} has "
            f"{max(n.mem_mb for n in members)}M",
        ),
    ]
    for failed, field, why in checks:
        if failed:
            raise InvalidInput(
                f"job can never run: {why} (Requested node configuration is not available)", field=field
            )
    fitting = {f.name for f in idle if node_fits(f, req)}
    unfit = [h for h in spec.nodelist if h not in fitting]
    if unfit:
        raise InvalidInput(
            f"job can never run: node {unfit[0]} (-w) cannot host one node of the job "
            "(Requested node configuration is not available)",
            field="nodelist",
        )
    if req.segment > 1 and fits_idle(idle, msgspec.structs.replace(req, switches=None, segment=1), blocks):
        sizes = block_sizes(idle, req, blocks)
        raise InvalidInput(
            f"job can never run: --segment={req.segment} puts each {req.segment} nodes in one block; the "
            f"blocks of partition {part.name} hold {sum(n // req.segment for n in sizes)} such segments "
            f"(largest block: {sizes[0]} nodes that fit), the job needs {req.nodes // req.segment} "
            "(Requested node configuration is not available)",
            field="segment",
        )
    if not enforce:
        return  # more nodes than the partition has: it pends (PartitionConfig), as with Slurm's default
    raise InvalidInput(
        f"job can never run: {req.nodes} nodes requested, partition {part.name} has {len(fitting)} that fit "
        "(Requested node configuration is not available)",
        field="nodes",
    )
