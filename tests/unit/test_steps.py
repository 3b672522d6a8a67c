"""srun's pure parts: task layout, per-task environment, output patterns, labels, exit status, options,
the step facts' subject and their accounting operations."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from test_jobenv import launch as launch_order

from corral.cli.errors import CliError
from corral.cli.srun import allocation_argv, parse_args, step_launch
from corral.cli.srun_io import Labeller, exit_message, step_status
from corral.libs.core.fold import apply
from corral.libs.core.state import State
from corral.schemas import events as ev
from corral.schemas import subjects
from corral.schemas.events import NodeAllocation
from corral.schemas.steps import StepLaunch, TaskExit
from corral.services.accounting.projection import EndStep, StartStep, convert
from corral.services.agent.jobenv import job_environment
from corral.services.agent.step_state import task_outcomes
from corral.services.agent.steplayout import StepLayoutError, expand_step_pattern, layout, task_environment

TWO_NODES = [
    NodeAllocation(node="gpu01", gpus=[1, 3, 5, 7], cpus=8),
    NodeAllocation(node="gpu02", gpus=[0, 2, 4, 6], cpus=8),
]


def places(**kw: Any) -> list[tuple[int, str, int, int, list[int]]]:
    return [(p.task, p.node, p.node_index, p.local_id, p.gpus) for p in layout(TWO_NODES, **kw)]


LAYOUTS: list[tuple[str, dict[str, Any], list[tuple[int, str, int, int, list[int]]]]] = [
    (
        "default-one-task-per-node",
        {},
        [(0, "gpu01", 0, 0, [1, 3, 5, 7]), (1, "gpu02", 1, 0, [0, 2, 4, 6])],
    ),
    (
        "N2-n4-block",
        {"nodes": 2, "ntasks": 4},
        [
            (0, "gpu01", 0, 0, [1, 3, 5, 7]),
            (1, "gpu01", 0, 1, [1, 3, 5, 7]),
            (2, "gpu02", 1, 0, [0, 2, 4, 6]),
            (3, "gpu02", 1, 1, [0, 2, 4, 6]),
        ],
    ),
    (
        "n3-uneven",
        {"ntasks": 3},
        [
            (0, "gpu01", 0, 0, [1, 3, 5, 7]),
            (1, "gpu01", 0, 1, [1, 3, 5, 7]),
            (2, "gpu02", 1, 0, [0, 2, 4, 6]),
        ],
    ),
    ("n1-batch-node-only", {"ntasks": 1}, [(0, "gpu01", 0, 0, [1, 3, 5, 7])]),
    (
        "gpus-per-task-slices",
        {"ntasks": 4, "gpus_per_task": 2},
        [
            (0, "gpu01", 0, 0, [1, 3]),
            (1, "gpu01", 0, 1, [5, 7]),
            (2, "gpu02", 1, 0, [0, 2]),
            (3, "gpu02", 1, 1, [4, 6]),
        ],
    ),
    (
        "ntasks-per-node-fills-in-order",
        {"ntasks": 3, "ntasks_per_node": 2},
        [
            (0, "gpu01", 0, 0, [1, 3, 5, 7]),
            (1, "gpu01", 0, 1, [1, 3, 5, 7]),
            (2, "gpu02", 1, 0, [0, 2, 4, 6]),
        ],
    ),
    (
        "ntasks-per-node-alone",
        {"ntasks_per_node": 1, "nodes": 1},
        [(0, "gpu01", 0, 0, [1, 3, 5, 7])],
    ),
]


@pytest.mark.parametrize(("kw", "expected"), [c[1:] for c in LAYOUTS], ids=[c[0] for c in LAYOUTS])
def test_layout(kw: dict[str, Any], expected: list[Any]) -> None:
    assert places(**kw) == expected


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"nodes": 3}, "Requested node configuration is not available"),
        ({"ntasks": 2, "nodes": 1, "gpus_per_task": 3}, "Requested GPU configuration is not available"),
        ({"ntasks": 4, "cpus_per_task": 5}, "More processors requested than permitted"),
        ({"ntasks": 5, "ntasks_per_node": 2}, "do not fit"),
        ({"ntasks": 0}, "--ntasks must be at least 1"),
    ],
    ids=["too-many-nodes", "too-many-gpus", "too-many-cpus", "per-node-too-small", "zero-tasks"],
)
def test_layout_refuses_what_does_not_fit(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(StepLayoutError, match=message):
        layout(TWO_NODES, **kw)


def step(**kw: Any) -> StepLaunch:
    return StepLaunch(job_id=4242, key="k", argv=["hostname"], cwd="/home/alice", **kw)


def test_task_environment_is_the_jobs_plus_the_tasks() -> None:
    order = launch_order({"gpu01": [1, 3], "gpu02": [0, 2]}, ntasks=4, nodes=2)
    tasks = layout(list(order.allocations), ntasks=4, gpus_per_task=1)
    job_env = job_environment(order, {"HOME": "/home/alice", "SLURM_PROCID": "9"}, 1000, 1000)
    env = task_environment(job_env, tasks[3], tasks, 2, step(gpus_per_task=1))
    assert env["HOME"] == "/home/alice"
    assert (env["SLURM_PROCID"], env["SLURM_LOCALID"], env["SLURM_NODEID"]) == ("3", "1", "1")
    assert (env["SLURM_STEP_ID"], env["SLURM_STEPID"], env["SLURM_STEP_NUM_TASKS"]) == ("2", "2", "4")
    assert env["SLURM_NTASKS"] == "4" and env["SLURM_STEP_NODELIST"] == "gpu[01-02]"
    assert env["SLURM_JOB_NODELIST"] == "gpu[01-02]" and env["SLURM_JOB_ID"] == "4242"
    # no --ntasks-per-node, srun's nor the job's: Slurm sets no SLURM_NTASKS_PER_NODE
    assert env["SLURM_STEP_TASKS_PER_NODE"] == "2(x2)" and "SLURM_NTASKS_PER_NODE" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == "2" and env["SLURM_STEP_GPUS"] == "2"
    assert env["SLURMD_NODENAME"] == "gpu02" and env["SLURM_GPUS_PER_TASK"] == "1"
    assert "ENVIRONMENT" not in env  # srun's environment (here: none) has no ENVIRONMENT=BATCH


@pytest.mark.parametrize(
    ("pattern", "task", "expected"),
    [
        ("out-%j-%t.txt", 0, "/home/alice/out-4242-0.txt"),
        ("%J.%N.%n", 3, "/home/alice/4242.2.gpu02.1"),
        ("/tmp/%x-%s-%3t-%u-%%", 1, "/tmp/train-2-001-alice-%"),
    ],
    ids=["job-task", "jobstep-node", "name-step-width-user"],
)
def test_step_output_pattern(pattern: str, task: int, expected: str) -> None:
    order = launch_order({"gpu01": [1, 3], "gpu02": [0, 2]}, ntasks=4, nodes=2)
    tasks = layout(list(order.allocations), ntasks=4)
    assert expand_step_pattern(pattern, order, 2, tasks[task], "/home/alice") == expected


def test_labels_complete_lines_and_pads_task_ids() -> None:
    labeller = Labeller(12)
    assert labeller.feed(3, "out", b"a\nb") == b" 3: a\n"
    assert labeller.feed(3, "out", b"c\n") == b" 3: bc\n"
    assert labeller.feed(11, "err", b"x") == b""
    assert labeller.flush(11, "err") == b"11: x\n"
    assert labeller.flush(3, "out") == b""


@pytest.mark.parametrize(
    ("exits", "status", "message"),
    [
        (
            [TaskExit(task=0, node="n1", exit_code=0), TaskExit(task=1, node="n2", exit_code=3)],
            3,
            "n2: task 1: Exited with exit code 3",
        ),
        ([TaskExit(task=0, node="n1", exit_code=0, signal=9)], 137, "n1: task 0: Killed by signal 9"),
        (
            [TaskExit(task=0, node="n1", exit_code=2, error="execve(): nope: No such file or directory")],
            2,
            "n1: task 0: execve(): nope: No such file or directory",
        ),
        ([TaskExit(task=0, node="n1", exit_code=0)], 0, None),
    ],
    ids=["worst-code", "signal", "exec-error", "success"],
)
def test_step_status_and_messages(exits: list[TaskExit], status: int, message: str | None) -> None:
    assert step_status(exits) == status
    assert exit_message(max(exits, key=lambda e: (e.exit_code, e.signal, e.error))) == message


def test_srun_options_inside_a_job_default_to_the_jobs_tasks() -> None:
    env = {"SLURM_NTASKS": "4", "SLURM_NNODES": "2"}
    inside = step_launch(parse_args(["-l", "hostname", "-x"]), env, "/w", inside=True)
    assert (inside.ntasks, inside.nodes, inside.argv, inside.name) == (4, 2, ["hostname", "-x"], "hostname")
    sized = step_launch(parse_args(["-N1", "hostname"]), env, "/w", inside=True)
    assert (sized.ntasks, sized.nodes) == (None, 1)
    outside = step_launch(parse_args(["-n", "2", "-D", "sub", "true"]), env, "/w", inside=False)
    assert (outside.ntasks, outside.nodes, outside.cwd) == (2, None, "/w/sub")


def test_allocation_gets_the_allocation_options_and_the_steps_shape() -> None:
    args = parse_args(["-N2", "--gres=gpu:1", "-p", "gpu", "--exclusive", "-l", "-o", "x", "python", "t.py"])
    launch = step_launch(args, {}, "/w", inside=False)
    assert allocation_argv(args, launch) == [
        "--gres=gpu:1",
        "--partition=gpu",
        "--exclusive",
        "--job-name=python",
        "--nodes=2",
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "No command given"),
        (["-n", "x", "true"], "--ntasks"),
        (["--pty", "bash"], "pty"),
        (["--open-mode=sometimes", "true"], "--open-mode"),
    ],
    ids=["no-command", "bad-count", "unsupported", "bad-open-mode"],
)
def test_bad_srun_command_lines(argv: list[str], message: str) -> None:
    with pytest.raises(CliError, match=message):
        step_launch(parse_args(argv), {}, "/w", inside=False)


STARTED = ev.StepStarted(
    job_id=7, attempt=1, step_id=0, node="gpu01", name="python", nodes=["gpu01", "gpu02"], ntasks=4, cpus=4
)


def test_step_facts_live_outside_the_jobs_subjects() -> None:
    subject = subjects.event_subject(STARTED)
    assert subject == "corral.evt.step.7.step_started.gpu01"
    assert not subject.startswith(subjects.job_events(7)[:-1])


def test_scheduler_fold_ignores_step_facts() -> None:
    state = State()
    apply(
        state, 1, ev.Envelope(meta=ev.Meta(event_id="e", occurred_at=5.0, actor="agent-gpu01"), body=STARTED)
    )
    assert state.jobs == {} and state.last_seq == 1


def test_step_facts_become_step_rows() -> None:
    exited = ev.StepExited(job_id=7, attempt=1, step_id=0, node="gpu01", exit_code=3)
    killed = ev.StepExited(job_id=7, attempt=1, step_id=1, node="gpu01", exit_code=0, signal=9, killed=True)
    oom = ev.StepExited(job_id=7, attempt=1, step_id=2, node="gpu01", exit_code=137, oom=True)
    meta = ev.Meta(event_id="e", occurred_at=5.0, actor="agent-gpu01")
    bodies = [STARTED, exited, killed, oom]
    # The tasks' outcomes are for traces: a step's row is the same with them.
    tasks = [ev.TaskOutcome(rank=0, node="gpu01", pid=9, exit_code=3, started_at=4.0, ended_at=5.0)]
    with_tasks = msgspec.structs.replace(exited, tasks=tasks, tasks_omitted=3)
    assert convert([(2, ev.Envelope(meta=meta, body=with_tasks))]) == convert(
        [(2, ev.Envelope(meta=meta, body=exited))]
    )
    ops = convert([(i + 1, ev.Envelope(meta=meta, body=b)) for i, b in enumerate(bodies)])
    assert ops == [
        StartStep(
            seq=1,
            job_id=7,
            attempt=1,
            step="0",
            name="python",
            start_time=5.0,
            node_list="gpu[01-02]",
            num_cpus=4,
            num_tasks=4,
            num_gpus=0,
        ),
        EndStep(seq=2, job_id=7, attempt=1, step="0", end_time=5.0, state="FAILED", exit_code=3, signal=0),
        EndStep(seq=3, job_id=7, attempt=1, step="1", end_time=5.0, state="CANCELLED", exit_code=0, signal=9),
        # An OOM kill in the step's cgroup: Slurm's OUT_OF_MEMORY 0:125, whatever the tasks' own status.
        EndStep(
            seq=4, job_id=7, attempt=1, step="2", end_time=5.0, state="OUT_OF_MEMORY", exit_code=0, signal=125
        ),
    ]


def test_a_steps_task_outcomes_are_each_tasks_exit_by_rank() -> None:
    exits = [
        TaskExit(task=1, node="gpu02", exit_code=0, pid=12, started_at=4.5, ended_at=6.0),
        TaskExit(task=0, node="gpu01", exit_code=3, pid=11, started_at=4.0, ended_at=5.0, error="x" * 500),
    ]
    outcomes, omitted = task_outcomes(exits, 3)  # task 2's exit never came
    assert outcomes == [
        ev.TaskOutcome(
            rank=0,
            node="gpu01",
            pid=11,
            started_at=4.0,
            ended_at=5.0,
            exit_code=3,
            error="x" * ev.MAX_TASK_ERROR,
        ),
        ev.TaskOutcome(rank=1, node="gpu02", pid=12, started_at=4.5, ended_at=6.0),
    ]
    assert omitted == 1


def test_a_huge_steps_outcomes_stay_well_under_natss_payload_limit_failed_tasks_first() -> None:
    node = "n" * 64  # the longest node name (a subject token)
    error = "\x01" * 1000  # escaped as \u0001 in JSON: 6 bytes a character
    exits = [
        TaskExit(
            task=t,
            node=node,
            exit_code=1 if t % 1000 == 999 else 0,
            pid=4_000_000 + t,
            started_at=1.7e9 + t / 7,
            ended_at=1.7e9 + t / 3,
            error=error if t % 2 else "",
        )
        for t in range(5000)
    ]
    outcomes, omitted = task_outcomes(exits, 5000)
    assert len(outcomes) + omitted == 5000 and 0 < len(outcomes) <= ev.MAX_STEP_TASKS
    assert [o.rank for o in outcomes] == sorted(o.rank for o in outcomes)
    # the failed ones (an error, or exit code 1) are kept before any that succeeded
    assert all(o.error or o.exit_code for o in outcomes)
    body = ev.StepExited(
        job_id=7, attempt=0, step_id=0, node=node, exit_code=1, tasks=outcomes, tasks_omitted=omitted
    )
    assert len(msgspec.json.encode(body)) < ev.MAX_STEP_TASKS_BYTES + 1024 < 1 << 20
    healthy = [TaskExit(task=t, node="gpu01", exit_code=0) for t in range(2000)]
    outcomes, omitted = task_outcomes(healthy, 2000)
    assert [o.rank for o in outcomes] == list(
        range(ev.MAX_STEP_TASKS)
    ) and omitted == 2000 - ev.MAX_STEP_TASKS
