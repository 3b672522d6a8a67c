"""Job steps (``srun``): the interactive request/reply messages between ``srun`` and the agents.

Steps are interactive, so they use core NATS, not the log:

- ``corral.step.<node>.<caller>``: requests to a node's agent; the last token is the caller's NATS user (a
  person, or a peer node's agent ``agent-<node>``), which the server's permissions bind to the connection.
  ``srun`` talks only to the job's *batch node* (its first node), whose agent holds the run's launch order
  and so knows the owner, the attempt and every node's GPUs: it checks the caller, numbers the step, lays out
  the tasks and asks its peers (``StepTasks``) to start theirs.
- ``corral.io.<user>.<key>.{out,err,exit}.<task>.<node>`` (the agent of the task's node -> srun) and
  ``corral.io.<user>.<key>.in.<node>`` (srun -> task 0's node): a step's output, task exits and stdin;
  ``key`` is a random token chosen by srun, so srun subscribes before it asks for the step.

The facts that last (the step started, the step ended) go to the log as ``StepStarted``/``StepExited``.
"""

from __future__ import annotations

import msgspec

from corral.schemas.api import LaunchOrder
from corral.schemas.events import OpenMode


class StepLaunch(msgspec.Struct, frozen=True, tag="step_launch", kw_only=True):
    """srun -> the batch node's agent: start a step of a running job."""

    job_id: int  # the job (SLURM_JOB_ID)
    key: str  # the step's I/O subject token, chosen by srun (random hex)
    argv: list[str]  # the command and its arguments
    cwd: str  # working directory of the tasks
    environment: dict[str, str] = {}  # srun's environment, passed to every task (SLURM_* are recomputed)
    name: str = ""  # step name (default: the command's base name)
    ntasks: int | None = None  # -n; None = from -N/--ntasks-per-node, else one task per node
    nodes: int | None = None  # -N; None = as many as the tasks need (at most all of the job's)
    ntasks_per_node: int | None = None  # --ntasks-per-node
    cpus_per_task: int = 1  # -c
    gpus_per_task: int | None = None  # --gpus-per-task: each task its own GPU indices
    stdout: str | None = None  # -o pattern (%j %J %t %N %n %s %x %u %%); None = to srun
    stderr: str | None = None  # -e pattern; None = to srun (or with -o's file)
    open_mode: OpenMode = "truncate"  # --open-mode of -o/-e files
    stdin: bool = True  # forward srun's stdin to task 0 (else /dev/null)
    # srun's end of its connection to the cluster, as the cluster sees it (Slurm's srun address and port:
    # SLURM_LAUNCH_NODE_IPADDR, SLURM_SRUN_COMM_HOST and _PORT); "" and 0: not known (an older srun)
    srun_host: str = ""
    srun_port: int = 0


class TaskPlace(msgspec.Struct, frozen=True, kw_only=True):
    """Where one task of a step runs."""

    task: int  # SLURM_PROCID
    node: str  # node name
    node_index: int  # SLURM_NODEID (index of the node in the step)
    local_id: int  # SLURM_LOCALID
    gpus: list[int] = []  # GPU indices the task sees (CUDA_VISIBLE_DEVICES)


class StepTasks(msgspec.Struct, frozen=True, tag="step_tasks", kw_only=True):
    """Batch node's agent -> a peer agent: start your tasks of a step."""

    launch: StepLaunch  # what srun asked for
    order: LaunchOrder  # the run's launch order (spec without script and environment)
    step_id: int  # the step's number
    user: str  # the job's owner (the I/O subjects are under it)
    tasks: list[TaskPlace]  # every task of the step, all nodes


class StepSignal(msgspec.Struct, frozen=True, tag="step_signal", kw_only=True):
    """srun (or the batch node's agent, to its peers) -> agent: signal every task of a step."""

    job_id: int  # the job
    step_id: int  # the step
    signal: int  # signal number; SIGKILL starts the kill sequence (SIGCONT+SIGTERM, SIGKILL after KillWait)
    attempt: int | None = None  # the step's run; None = the job's live run (srun does not know it)
    raw: bool = False  # deliver SIGKILL as it is (scancel -f -s KILL), not as the kill sequence


class StepPoll(msgspec.Struct, frozen=True, tag="step_poll", kw_only=True):
    """Batch node's agent -> a peer agent: how have your tasks of a step ended so far? (Task exits travel on
    core NATS and may be lost; the step's coordinator asks for those it is missing.)"""

    job_id: int  # the job
    attempt: int  # the step's run
    step_id: int  # the step


class AllocationRelease(msgspec.Struct, frozen=True, tag="allocation_release", kw_only=True):
    """srun/salloc -> the batch node's agent: end an interactive allocation with this exit code."""

    job_id: int  # the job (submitted by srun/salloc with the allocation placeholder script)
    exit_code: int  # what the job ends with (0-255)


StepRequest = StepLaunch | StepTasks | StepSignal | StepPoll | AllocationRelease


class StepLaunched(msgspec.Struct, frozen=True, tag="step_launched", kw_only=True):
    """Reply to StepLaunch/StepTasks: the step runs."""

    step_id: int  # the step's number (N.<step_id> in sacct)
    tasks: list[TaskPlace]  # every task, by task id


class StepDone(msgspec.Struct, frozen=True, tag="step_done", kw_only=True):
    """Reply to StepSignal/AllocationRelease: done."""


class StepPolled(msgspec.Struct, frozen=True, tag="step_polled", kw_only=True):
    """Reply to StepPoll: the exits of the node's tasks of that step that have ended."""

    known: bool  # False: the node has no such step (it never got it, or forgot it after its end)
    exits: list[TaskExit] = []  # the node's tasks that have ended


class TaskExit(msgspec.Struct, frozen=True, kw_only=True):
    """Payload of ``corral.io.<user>.<key>.exit.<task>``: how one task ended."""

    task: int  # SLURM_PROCID
    node: str  # where it ran
    exit_code: int  # 0-255 (0 when killed by a signal)
    signal: int = 0  # terminating signal, 0 if none
    error: str = ""  # why it could not start, "" if it did
    oom: bool = False  # the kernel's OOM killer ended it (its node's memory cgroup counted a kill)
    pid: int = 0  # its process id (= its process group) on its node; 0 if it never started or is unknown
    started_at: float = 0.0  # when its supervisor started it (its node's wall clock, s); 0.0 if unknown
    ended_at: float = 0.0  # when its supervisor saw it end (its node's wall clock, s); 0.0 if unknown


def step_subject(node: str, caller: str) -> str:
    """Request subject of a node's agent, called by ``caller`` (a user or ``agent-<node>``)."""
    return f"corral.step.{node}.{caller}"


def io_subject(user: str, key: str, kind: str, task: int | str | None, node: str) -> str:
    """I/O subject of a step: kind out/err/exit of a task (``task`` ``"*"`` for any) from the node that runs
    it, or in (``task`` None): task 0's stdin, to the node that runs it. The node token is the one the
    server's permissions bind to an agent, so an agent can speak only for its own node's tasks and hears
    only the stdin of its own (``roles.agent_user``)."""
    base = f"corral.io.{user}.{key}.{kind}"
    return f"{base}.{node}" if task is None else f"{base}.{task}.{node}"


def io_source(subject: str, nodes: dict[int, str]) -> tuple[str, int] | None:
    """(kind, task) of an out/err/exit message of a step whose tasks run on ``nodes`` (task -> node), if it
    came from the node that runs that task; None for anything else (it is ignored: no agent speaks for a
    task of another node)."""
    parts = subject.split(".")
    if len(parts) != 7 or parts[4] not in ("out", "err", "exit") or not parts[5].isdigit():
        return None
    task = int(parts[5])
    return (parts[4], task) if nodes.get(task) == parts[6] else None


#: The batch script of an interactive allocation (srun outside a job, salloc): it runs nothing and ends,
#: with the exit code the allocation is released with, when the agent writes that code into the FIFO
#: ``release`` next to the script (``AllocationRelease``). Its first two lines mark it for the agent.
ALLOCATION_SCRIPT = """\
#!/bin/sh
# corral: interactive allocation (srun/salloc); ends when the allocation is released
fifo="$(dirname "$0")/release"
mkfifo "$fifo" 2>/dev/null
read -r code < "$fifo"
exit "${code:-0}"
"""
