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


class StepExited(msgspec.Struct, frozen=True, tag="step_exited", kw_only=True):
    """Fact (batch node's agent): every task of a step ended; the exit of the worst task."""

    job_id: JobId  # the job
    attempt: int  # the run
    step_id: int  # the step
    node: NodeName  # the reporting (batch) node
    exit_code: int  # highest task exit code
    signal: int = 0  # a terminating signal of a task, 0 if none
    killed: bool = False  # the step was killed (Ctrl-C twice, or its run ended first)
    oom: bool = False  # a task was OOM-killed (its node's memory cgroup counted the kill)
