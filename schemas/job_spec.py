"""What a user asks for when submitting a job: ``JobSpec`` and its parts (dependencies, arrays, constraints,
the warning signal). Carried by ``JobSubmitted`` and the API's ``SubmitRequest``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal, NoReturn

import msgspec

from corral.schemas.ids import JobId

# --- bounds: the one statement of what the gateway accepts, enforced by the decoder of every API message and
# log entry (msgspec.Meta) and carried by the generated JSON Schema (``schemas/jsonschema``). The gateway's
# ``validate.py`` checks the same constants again for a spec built in Python (the CLI's), with Slurm's words,
# plus what a schema cannot say (the script's size in bytes, the cluster's partitions and nodes).

#: Largest batch script, in bytes of UTF-8 (the schema's maxLength counts characters: at most this many).
MAX_SCRIPT_BYTES = 4 * 1024 * 1024
#: Largest environment, in bytes (names, values and a separator each).
MAX_ENV_BYTES = 1024 * 1024
#: Longest name (job name, node, feature).
MAX_NAME = 256
#: Most script arguments.
MAX_ARGS = 1024
#: Most nodes a job may ask for, or list with -w / -x.
MAX_NODES = 100_000
#: Slurm's bound of a nice value (NICE_OFFSET - 3).
MAX_NICE = 2147483645
#: Most items one dependency list may hold (a list is stored with every job).
MAX_DEPENDENCIES = 1000

#: At least 1 (nodes, tasks, CPUs, a time limit ...).
Positive = Annotated[int, msgspec.Meta(ge=1)]
#: At least 0.
NonNegative = Annotated[int, msgspec.Meta(ge=0)]
#: A name: 1 to MAX_NAME characters.
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME)]

#: ``--open-mode`` of the job's stdout and stderr files.
OpenMode = Literal["truncate", "append"]

#: Kinds of job dependency (sbatch -d), with Slurm's meaning:
#: after = the dependee started (or ended without starting), afterok = it COMPLETED,
#: afternotok = it ended in any other terminal state, afterany = it ended,
#: singleton = no earlier job of the same name and user is pending or running.
DependencyType = Literal["after", "afterok", "afternotok", "afterany", "singleton"]


class Dependency(msgspec.Struct, frozen=True, kw_only=True):
    """One condition of a job's dependency list (``afterok:5:6`` is two of them)."""

    type: DependencyType  # the kind of condition
    job_id: Annotated[JobId, msgspec.Meta(ge=0)] = 0  # the job it is about; 0 for singleton


class Dependencies(msgspec.Struct, frozen=True, kw_only=True):
    """A job's dependency list: all of it must hold (``,``) or any one item (``?``)."""

    items: Annotated[
        list[Dependency], msgspec.Meta(min_length=1, max_length=MAX_DEPENDENCIES)
    ]  # the conditions
    any_of: bool = False  # True: one satisfied item is enough (``?``); False: all must be (``,``)


class ArrayRange(msgspec.Struct, frozen=True, kw_only=True):
    """One item of ``sbatch --array``: ``start[-end[:step]]`` (a single index has end = start)."""

    start: int  # first index
    end: int  # last index (inclusive)
    step: int = 1  # every step-th index from start


class ArraySpec(msgspec.Struct, frozen=True, kw_only=True):
    """A job array (``sbatch --array=0-999%32``): one job per index, each with its own job id.

    The task with the k-th smallest index gets the k-th id of the block the gateway reserved; the first
    id is the array's id (``SLURM_ARRAY_JOB_ID``, ``%A``). At most MaxArraySize (1001) tasks, indices
    0..1000.
    """

    ranges: list[ArrayRange]  # the items as given; the indices are their union, in ascending order
    throttle: int = 0  # ``%P``: at most this many tasks of the array run at once; 0 = no limit


class Constraint(msgspec.Struct, frozen=True, kw_only=True):
    """``--constraint``: node features a job's nodes must have (``a``, ``a&b`` all of them, ``a|b`` any)."""

    features: Annotated[list[Name], msgspec.Meta(min_length=1)]  # feature names, as given, at least one
    any_of: bool = False  # True: a node needs one of the features (``|``); False: all of them (``&``)


class WarnSignal(msgspec.Struct, frozen=True, kw_only=True):
    """``--signal=[B:]SIG@T``: a warning signal T seconds before the time limit, once per run."""

    signum: int  # the signal's number (10 = SIGUSR1 on Linux)
    seconds_before: int = 60  # T: seconds before the limit (Slurm's default 60)
    batch_only: bool = False  # B: only the batch shell gets it; else the tasks of the job's steps


class ReadOnlyDict(dict[str, str]):
    """A dict that refuses changes: one instance can be the default of every struct (msgspec copies a ``{}``
    default into each instance, and cannot encode a ``MappingProxyType``)."""

    __slots__ = ()

    def _read_only(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("this mapping is read-only (a shared default): build a new dict instead")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _read_only


#: The default of ``JobSpec.environment``: one read-only empty mapping shared by every spec without one. With
#: ``()`` as the list fields' default, a spec that has none of them allocates nothing for them: the scheduler
#: keeps a million slim specs, whose environment is never decoded (``bench/rebuild.py``).
NO_ENVIRONMENT: Mapping[str, str] = ReadOnlyDict()


class JobSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a user asked for: everything needed to schedule and launch a batch job.

    The script is copied at submit time; the submitter may delete the file right after.
    """

    name: Name  # job name (-J); defaults to the script's file name, "sbatch" for stdin
    # The full text (the gateway requires #! first; not a pattern here: the scheduler's state and snapshots
    # keep the spec without its script, ``fold.slim_spec``, and decode it with this Struct).
    script: Annotated[str, msgspec.Meta(max_length=MAX_SCRIPT_BYTES)]
    argv: Annotated[tuple[str, ...], msgspec.Meta(max_length=MAX_ARGS)] = ()  # arguments passed to the script
    workdir: Annotated[str, msgspec.Meta(pattern="^/")]  # absolute submit directory; the script runs here
    environment: Mapping[str, str] = NO_ENVIRONMENT  # the submitter's environment to export (--export=ALL)
    stdout: str | None = None  # -o pattern (%j %x %u %N ...); None = slurm-%j.out in workdir
    stderr: str | None = None  # -e pattern; None = merged into stdout
    open_mode: OpenMode = "truncate"  # --open-mode for stdout/stderr
    partition: str | None = None  # -p; None = the cluster's default partition
    account: str | None = None  # -A; None = the user's default account
    nodes: Annotated[int, msgspec.Meta(ge=1, le=MAX_NODES)] = 1  # -N: number of nodes
    ntasks: Positive = 1  # -n: number of tasks
    ntasks_per_node: Positive | None = None  # --ntasks-per-node
    cpus_per_task: Positive = 1  # -c
    mem_per_node_mb: NonNegative | None = None  # --mem in MiB; None = the partition default (0 = whole node)
    gpus_per_node: NonNegative = 0  # from --gres=gpu[:type]:N or --gpus-per-node
    gpu_type: str | None = None  # typed GPU request (gpu:h100:4); None = any type
    time_limit_s: Positive | None = None  # -t in seconds; None = the partition's default
    requeue: bool = True  # --requeue / --no-requeue: may the job be requeued on node failure
    submit_host: str = ""  # host sbatch ran on (SLURM_SUBMIT_HOST)
    dependencies: Dependencies | None = None  # -d: start only once these hold; None = no dependency
    held: bool = False  # -H: submitted held (JobHeldUser) until released
    begin_time: float | None = None  # -b: not eligible before this Unix time; None = at once
    array: ArraySpec | None = None  # -a/--array: one job per index; None = a single job
    nodelist: Annotated[
        tuple[Name, ...], msgspec.Meta(max_length=MAX_NODES)
    ] = ()  # -w: nodes the job must include (expanded hostlist); () = any
    exclude: Annotated[
        tuple[Name, ...], msgspec.Meta(max_length=MAX_NODES)
    ] = ()  # -x: nodes the job must not use (expanded hostlist)
    constraint: Constraint | None = None  # -C: node features required; None = any node
    exclusive: bool = False  # --exclusive: whole nodes, all their CPUs, GPUs and memory, shared with no job
    gpus_per_task: Positive | None = (
        None  # --gpus-per-task (gpus_per_node already holds tasks per node x this)
    )
    cpus_per_gpu: Positive | None = None  # --cpus-per-gpu: CPUs per node = gpus_per_node x this (not with -c)
    qos: str | None = None  # -q/--qos; None = the partition's QOS, else the default QOS (resolved at submit)
    nice: Annotated[int, msgspec.Meta(ge=-MAX_NICE, le=MAX_NICE)] = (
        0  # --nice: subtracted from the priority; only an admin may give a negative value
    )
    reservation: str | None = None  # --reservation: run only in this advance reservation; None = outside any
    switches: Positive | None = None  # --switches=N: at most N topology blocks; None = any number
    switches_wait_s: NonNegative | None = (
        None  # --switches=N@T: wait at most T s for them (None: max_switch_wait)
    )
    segment: Positive | None = (
        None  # --segment=N: nodes in segments of N, each inside one block; None = no rule
    )
    warn_signal: WarnSignal | None = None  # --signal: warning signal before the time limit; None = none
    wckey: str | None = None  # --wckey: workload characterization key, recorded with the job; None = none
    command: str | None = None  # the script's absolute path (scontrol's Command=); None = stdin or --wrap
    interactive: bool = False  # an salloc/srun allocation, not a batch job of the user's (BatchFlag=0)
    # The job has a task count of its own: -n, or --ntasks-per-node (ntasks = nodes x it), as Slurm's sbatch
    # sets one; its batch shell then has SLURM_NTASKS. False: ntasks is sbatch's default, one task per node,
    # and Slurm sets no SLURM_NTASKS. True for a spec from before this field (which always had it).
    ntasks_set: bool = True
