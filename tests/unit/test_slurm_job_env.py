"""The job environment in Slurm 22.05's forms (issue 15, item 4): what Slurm's sbatch, srun, slurmstepd and
gres/gpu plugin set (``src/common/env.c`` ``env_array_for_batch_job``/``setup_env``/``env_array_for_step``,
``src/sbatch/opt.c`` ``set_envs``, ``src/slurmd/slurmstepd/task.c`` ``exec_task``, ``src/plugins/gres/common/
gres_common.c``, topology/tree's ``topo_get_node_addr``), and nothing Slurm does not set."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec
import pytest
from test_jobenv import GID, UID, launch
from test_stepd import ENV, run, task

from corral.cli.sbatch_args import build_submission, parse_command_line
from corral.cli.srun import parse_args, step_launch
from corral.schemas.events import JobSpec
from corral.schemas.steps import StepLaunch
from corral.services.agent.jobenv import NodeEnv, job_environment, topology_address
from corral.services.agent.stepdir import StepDir
from corral.services.agent.steplayout import layout, task_environment

pytestmark = pytest.mark.unit

SCRIPT = b"#!/bin/bash\nsrun hostname\n"
GPU_ORDINALS = ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")


def sbatch_spec(*argv: str) -> JobSpec:
    """The spec sbatch builds for ``argv`` (the real command line parser)."""
    invocation = parse_command_line([*argv, "job.sh"])
    return build_submission(invocation, SCRIPT, environ={}, cwd="/home/alice", hostname="login1").spec


# --- the batch shell's task counts ---------------------------------------------------------------

# (sbatch options, allocated CPUs per node) -> SLURM_NTASKS, SLURM_NTASKS_PER_NODE, SLURM_TASKS_PER_NODE
TASK_COUNTS = [
    ("no-n", ["-N2"], 1, (None, None, "1(x2)")),
    ("no-n-cpus-per-task", ["-N2", "-c", "2"], 8, (None, None, "4(x2)")),
    ("no-n-whole-allocation", [], 16, (None, None, "16")),
    ("n", ["-n", "4", "-N2"], 2, ("4", None, "2(x2)")),
    ("ntasks-per-node", ["-N2", "--ntasks-per-node=3"], 3, ("6", "3", "3(x2)")),
    ("ntasks-per-node-without-N", ["--ntasks-per-node=2"], 2, ("2", "2", "2")),
]


@pytest.mark.parametrize(
    ("argv", "cpus", "expected"), [c[1:] for c in TASK_COUNTS], ids=[c[0] for c in TASK_COUNTS]
)
def test_batch_task_counts_as_slurm_sets_them(argv: list[str], cpus: int, expected: tuple[Any, ...]) -> None:
    spec = sbatch_spec(*argv)
    nodes: dict[str, list[int]] = {f"gpu{i:02d}": [] for i in range(1, spec.nodes + 1)}
    order = msgspec.structs.replace(launch(nodes, cpus=cpus), spec=spec)
    env = job_environment(order, {}, UID, GID)
    ntasks, per_node, tasks_per_node = expected
    assert (env.get("SLURM_NTASKS"), env.get("SLURM_NPROCS")) == (ntasks, ntasks)
    assert env.get("SLURM_NTASKS_PER_NODE") == per_node
    assert env["SLURM_TASKS_PER_NODE"] == tasks_per_node


def test_the_spec_says_whether_the_job_has_a_task_count() -> None:
    assert not sbatch_spec("-N2").ntasks_set
    assert sbatch_spec("-n", "2").ntasks_set and sbatch_spec("--ntasks-per-node=2").ntasks_set


def test_a_spec_from_before_the_field_keeps_its_task_count() -> None:
    """Old events decode with the task count they always had in the environment."""
    old = msgspec.json.encode({"name": "j", "script": "#!/bin/sh\n", "workdir": "/w", "ntasks": 3})
    spec = msgspec.json.decode(old, type=JobSpec)
    assert spec.ntasks_set
    order = msgspec.structs.replace(launch({"gpu01": []}), spec=spec)
    assert job_environment(order, {}, UID, GID)["SLURM_NTASKS"] == "3"
    unset = msgspec.structs.replace(spec, ntasks_set=False)
    assert msgspec.json.decode(msgspec.json.encode(unset), type=JobSpec).ntasks_set is False


@pytest.mark.parametrize(
    ("spec", "name", "value"),
    [
        ({}, "SLURM_OPEN_MODE", None),
        ({"open_mode": "append"}, "SLURM_OPEN_MODE", "a"),
        ({}, "SLURM_JOB_RESERVATION", None),
        ({"reservation": "maint"}, "SLURM_JOB_RESERVATION", "maint"),
    ],
    ids=["open-mode-not-given", "open-mode-append", "no-reservation", "reservation"],
)
def test_variables_slurm_sets_only_for_what_was_asked(
    spec: dict[str, str], name: str, value: str | None
) -> None:
    assert job_environment(launch(**spec), {}, UID, GID).get(name) == value


# --- what the node adds ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("blocks", "expected"),
    [
        ({}, ("gpu01", "node")),
        ({"gpu01": "nvl1", "gpu02": "nvl1"}, ("nvl1.gpu01", "switch.node")),
        ({"gpu02": "nvl1"}, (".gpu01", "switch.node")),
    ],
    ids=["topology-none", "in-a-switch", "in-no-switch-of-a-tree"],
)
def test_topology_address_is_topology_trees(blocks: dict[str, str], expected: tuple[str, str]) -> None:
    assert topology_address("gpu01", blocks) == expected


def test_the_node_adds_its_conf_topology_and_the_runs_tmpdir() -> None:
    node = NodeEnv(
        tmpdir="/tmp/corral-x/42.0", conf="/etc/corral/cluster.toml", topology=("s1.gpu01", "switch.node")
    )
    env = job_environment(launch(environment={"TMPDIR": "/home/alice/tmp"}), {}, UID, GID, node)
    assert env["TMPDIR"] == "/tmp/corral-x/42.0"  # the run's own, over the one the submitter exported
    assert env["SLURM_CONF"] == "/etc/corral/cluster.toml"
    assert (env["SLURM_TOPOLOGY_ADDR"], env["SLURM_TOPOLOGY_ADDR_PATTERN"]) == ("s1.gpu01", "switch.node")


@pytest.mark.parametrize(("exported", "tmpdir"), [({}, "/tmp"), ({"TMPDIR": "/scratch/a"}, "/scratch/a")])
def test_without_a_private_tmpdir_slurmstepds_default(exported: dict[str, str], tmpdir: str) -> None:
    env = job_environment(launch(environment=exported), {}, UID, GID)
    assert env["TMPDIR"] == tmpdir and "SLURM_CONF" not in env


def test_the_batch_environment_of_another_node_is_that_nodes() -> None:
    order = msgspec.structs.replace(launch({"gpu01": [1, 3], "gpu02": [0]}, cpus=8), node="gpu02")
    env = job_environment(order, {}, UID, GID)
    assert (env["HOSTNAME"], env["SLURMD_NODENAME"], env["SLURM_GPUS_ON_NODE"]) == ("gpu02", "gpu02", "1")
    assert all(env[name] == "0" for name in GPU_ORDINALS) and env["SLURM_JOB_GPUS"] == "0"


# --- a step's tasks ----------------------------------------------------------------------------------

#: srun's environment in a batch shell: what the batch shell exported, and what srun adds
SRUN_ENV = {"HOSTNAME": "gpu01", "ENVIRONMENT": "BATCH", "SLURM_JOB_GPUS": "1,3", "SLURM_UMASK": "0027"}


def step_env(task_id: int, *, srun_env: dict[str, str] | None = None, **kw: Any) -> dict[str, str]:
    """Task ``task_id``'s environment in a step of a 2-node job (gpu01: GPUs 1,3; gpu02: 0,2)."""
    order = launch({"gpu01": [1, 3], "gpu02": [0, 2]}, ntasks=4, nodes=2)
    shape = {k: kw.pop(k) for k in ("ntasks", "nodes", "ntasks_per_node", "gpus_per_task") if k in kw}
    places = layout(list(order.allocations), **shape)
    place = places[task_id]
    node_env = job_environment(msgspec.structs.replace(order, node=place.node), srun_env or {}, UID, GID)
    launch_ = StepLaunch(
        job_id=4242, key="k", argv=["env"], cwd="/", environment=srun_env or {}, **shape, **kw
    )
    return task_environment(node_env, place, places, 0, launch_)


def test_step_task_ids_on_each_node_and_the_distribution() -> None:
    assert step_env(1, ntasks=4)["SLURM_GTIDS"] == "0,1"
    assert step_env(3, ntasks=4)["SLURM_GTIDS"] == "2,3"
    assert step_env(0, ntasks=4)["SLURM_DISTRIBUTION"] == "block"
    assert step_env(1)["SLURM_DISTRIBUTION"] == "cyclic"  # one task per node (srun's default)
    assert step_env(0, ntasks=1)["SLURM_DISTRIBUTION"] == "cyclic"


def test_step_tasks_know_where_srun_is() -> None:
    env = step_env(1, srun_host="10.1.2.3", srun_port=41234)
    assert env["SLURM_LAUNCH_NODE_IPADDR"] == env["SLURM_SRUN_COMM_HOST"] == "10.1.2.3"
    assert env["SLURM_SRUN_COMM_PORT"] == env["SLURM_STEP_LAUNCHER_PORT"] == "41234"
    assert "SLURM_SRUN_COMM_PORT" not in step_env(1)  # an srun that did not say


def test_step_tasks_keep_what_srun_had_of_the_batch_shell() -> None:
    """slurmstepd sets HOSTNAME and ENVIRONMENT for a batch shell only, and SLURM_JOB_GPUS in no step: the
    tasks on every node have srun's (the batch shell's), and an srun outside a job has none."""
    env = step_env(1, srun_env=SRUN_ENV)  # on gpu02
    assert (env["HOSTNAME"], env["ENVIRONMENT"], env["SLURM_JOB_GPUS"]) == ("gpu01", "BATCH", "1,3")
    assert env["SLURM_UMASK"] == "0027" and env["SLURMD_NODENAME"] == "gpu02"
    outside = step_env(1)
    assert not {"HOSTNAME", "ENVIRONMENT", "SLURM_JOB_GPUS", "SLURM_UMASK"} & set(outside)


def test_step_gpus_each_runtime_and_the_steps_count_on_the_node() -> None:
    env = step_env(3, ntasks=4, gpus_per_task=1)
    assert all(env[name] == "2" for name in GPU_ORDINALS) and env["SLURM_STEP_GPUS"] == "2"
    assert env["SLURM_GPUS_ON_NODE"] == "2"  # the step's GPUs on gpu02, not the task's one
    whole = step_env(0)
    assert whole["ZE_AFFINITY_MASK"] == "1,3" and whole["SLURM_GPUS_ON_NODE"] == "2"


def test_a_step_without_gpus_has_no_gpu_variables() -> None:
    order = launch({"cpu01": []}, ntasks=1, nodes=1)
    places = layout(list(order.allocations))
    srun_env = {"CUDA_VISIBLE_DEVICES": "0", "SLURM_GPUS_ON_NODE": "0"}
    env = task_environment(
        job_environment(order, srun_env, UID, GID),
        places[0],
        places,
        0,
        StepLaunch(job_id=1, key="k", argv=["x"], cwd="/"),
    )
    assert not {"SLURM_GPUS_ON_NODE", "SLURM_STEP_GPUS", *GPU_ORDINALS} & set(env)


def test_step_ntasks_per_node_is_sruns() -> None:
    assert step_env(0, ntasks=4, ntasks_per_node=2)["SLURM_NTASKS_PER_NODE"] == "2"
    assert "SLURM_NTASKS_PER_NODE" not in step_env(0, ntasks=4)


# --- srun's side ---------------------------------------------------------------------------------------


def test_srun_adds_its_umask_and_debug_level_unless_set() -> None:
    mask = os.umask(0o027)
    try:
        launch_ = step_launch(parse_args(["-vv", "hostname"]), {"SLURM_JOB_ID": "5"}, "/", inside=True)
    finally:
        os.umask(mask)
    assert (launch_.environment["SLURM_UMASK"], launch_.environment["SRUN_DEBUG"]) == ("0027", "5")
    kept = step_launch(parse_args(["-Q", "true"]), {"SLURM_UMASK": "0077"}, "/", inside=False)
    assert (kept.environment["SLURM_UMASK"], kept.environment["SRUN_DEBUG"]) == ("0077", "2")


def test_srun_inside_a_job_takes_its_ntasks_per_node() -> None:
    inside = {"SLURM_NNODES": "2", "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2"}
    launch_ = step_launch(parse_args(["-N1", "hostname"]), inside, "/", inside=True)
    assert (launch_.nodes, launch_.ntasks, launch_.ntasks_per_node) == (1, None, 2)
    assert layout(list(launch().allocations), nodes=1, ntasks_per_node=2)[-1].task == 1  # 2 tasks on 1 node


# --- as each task starts (the supervisor) ------------------------------------------------------------------


def test_each_task_gets_its_own_pid_and_a_step_sruns_umask(tmp_path: Path) -> None:
    sdir = StepDir(tmp_path / "stepd", (1, 0, 0))
    sdir.create()
    probe = 'echo "$SLURM_TASK_PID $$ $(umask)"'
    tasks = [task(sdir, 0, probe), task(sdir, 1, probe)]
    tasks[1] = msgspec.structs.replace(tasks[1], env={**ENV, "SLURM_UMASK": "0077"})
    run(sdir, tasks)
    for number, mask in ((0, None), (1, "0077")):
        pid, shell, umask = sdir.spool("out", number).read_text().split()
        assert pid == shell  # the task's own pid, the same after its exec
        if mask is not None:
            assert umask == mask
