"""The facts agents report about a job's runs and steps: a batch script started and exited (``RunStarted``,
``RunExited``, on ``corral.evt.job.<id>.<tag>.<node>``) and a step started and ended (``StepStarted``,
``StepExited``, on ``corral.evt.step.<job>.<tag>.<node>``).
"""

from __future__ import annotations

import msgspec

from corral.schemas.ids import JobId, NodeName


class RunStarted(msgspec.Struct, frozen=True, tag="run_started", kw_only=True):
    """Fact (agent): the batch script of a run started on this node."""

    job_id: JobId  # the job
    attempt: int  # the run
    node: NodeName  # the reporting agent's node
    pid: int  # process id of the batch shell on that node


class RunExited(msgspec.Struct, frozen=True, tag="run_exited", kw_only=True):
    """Fact (agent): the batch script of a run ended on this node (or could not start)."""

    job_id: JobId  # the job
    attempt: int  # the run
    node: NodeName  # the reporting agent's node
    exit_code: int  # 0-255; 0 when killed by a signal
    signal: int = 0  # terminating signal number, 0 if none
    oom: bool = False  # the kernel's OOM killer ended it
    launch_error: str | None = None  # set when the script could not be started (why, for the user)
    killed: bool = False  # the agent killed it on an order (cancel, requeue)
    timed_out: bool = False  # the agent killed it at its time limit


class StepStarted(msgspec.Struct, frozen=True, tag="step_started", kw_only=True):
    """Fact (agent of the job's batch node, which coordinates the step): a step of a run started (srun).

    On ``corral.evt.step.<job>.step_started.<node>``, outside the job's subjects: step facts never move the
    job subject's last sequence that the scheduler's decisions are conditional on.
    """

    job_id: JobId  # the job
    attempt: int  # the run
    step_id: int  # the step's number, from 0 per run (``N.0``, ``N.1``)
    node: NodeName  # the reporting (batch) node
    name: str  # step name (the command's base name, or srun -J)
    nodes: list[NodeName]  # the step's nodes
    ntasks: int  # tasks over all nodes
    cpus: int = 0  # CPUs of the step's tasks (tasks x cpus per task)
    gpus: int = 0  # GPUs bound to its tasks (0 when tasks share the node's GPUs)


#: Most tasks a ``StepExited`` lists (``tasks``); the others are only counted (``tasks_omitted``).
MAX_STEP_TASKS = 1024
#: Most bytes of JSON the listed tasks take together: with ``MAX_STEP_TASKS`` it keeps the entry well
#: under NATS's default max_payload of 1 MiB, whatever the nodes' names and the tasks' errors.
MAX_STEP_TASKS_BYTES = 512 * 1024
#: Longest ``TaskOutcome.error`` (characters; a longer one is cut).
MAX_TASK_ERROR = 200


class TaskOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How one task of a step ran, as its node's step supervisor recorded it (``StepExited.tasks``)."""

    rank: int  # SLURM_PROCID
    node: NodeName  # where it ran
    pid: int = 0  # its process id on that node; 0 if it never started or is unknown
    started_at: float = 0.0  # when it started (its node's wall clock, s since the epoch); 0.0 if unknown
    ended_at: float = 0.0  # when it ended (its node's wall clock); 0.0 if unknown
    exit_code: int = 0  # 0-255 (0 when killed by a signal)
    signal: int = 0  # terminating signal, 0 if none
    oom: bool = False  # the kernel's OOM killer ended it
    error: str = ""  # why it could not start or was lost, at most MAX_TASK_ERROR characters; "" if none


class StepExited(msgspec.Struct, frozen=True, tag="step_exited", kw_only=True):
    """Fact (batch node's agent): every task of a step ended; the exit of the worst task, and each task's.

    ``tasks`` is bounded so that the entry stays well under NATS's 1 MiB payload limit however large the
    step: at most ``MAX_STEP_TASKS`` outcomes, at most ``MAX_STEP_TASKS_BYTES`` of JSON together. The failed
    tasks (non-zero exit, signal, OOM, error) are kept before the others, then the lowest ranks; the list is
    in rank order and ``tasks_omitted`` counts those left out. Entries written before tasks were recorded
    have neither (an empty list, 0 omitted).
    """

    job_id: JobId  # the job
    attempt: int  # the run
    step_id: int  # the step
    node: NodeName  # the reporting (batch) node
    exit_code: int  # highest task exit code
    signal: int = 0  # a terminating signal of a task, 0 if none
    killed: bool = False  # the step was killed (Ctrl-C twice, or its run ended first)
    oom: bool = False  # a task was OOM-killed (its node's memory cgroup counted the kill)
    tasks: list[TaskOutcome] = []  # each task's outcome, by rank, bounded as the docstring says
    tasks_omitted: int = 0  # tasks of the step not in ``tasks`` (the bound)
