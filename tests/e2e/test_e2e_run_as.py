"""Jobs run as their submitting Unix user (issue 13): two real users on one cluster started by root, each
job with its owner's uid, groups, home and files, neither user able to touch the other's jobs or files,
root's jobs refused by default, and a user the nodes do not know running nothing."""

from __future__ import annotations

import getpass
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cli import Cli, cli_as, user_env
from unix_users import UnixUser, UserCli, open_directory, unix_users, user_cli, user_commands

from corral.cli.local_cluster import LocalCluster, ensure_resolvable

pytestmark = pytest.mark.e2e

ALICE, BOB = "ctest-alice", "ctest-bob"
#: alice's supplementary group
TEAM = "ctest-team"
#: a user with credentials whom no node knows
GHOST = "ctest-ghost"

#: What a job says of who it runs as; with ``--export=NONE`` its login basics come from the node's lookup.
IDENTITY = """#!/bin/bash
echo "user=$(id -un)"
echo "groups=$(id -G)"
echo "home=$HOME user=$USER logname=$LOGNAME shell=$SHELL"
echo "slurm=$SLURM_JOB_USER $SLURM_JOB_UID $SLURM_JOB_GID"
echo "pwd=$(pwd)"
cat {secret} >/dev/null 2>&1 && echo "secret=read" || echo "secret=refused"
"""
SLEEPER = "#!/bin/bash\n#SBATCH -o /dev/null\nsleep 300\n"


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, UnixUser]]:
    """ctest-alice (in ctest-team) and ctest-bob, real users (corral- names are the services'), removed
    afterwards."""
    with unix_users((ALICE, BOB), TEAM) as made:
        yield {u.name: u for u in made}


@pytest.fixture(scope="module")
def cluster(users: dict[str, UnixUser]) -> Iterator[LocalCluster]:
    """A 2-node cluster started by root whose configuration does not allow root's jobs, with alice, bob
    and the ghost as its users (a state directory the users can traverse to their scripts, not read)."""
    with open_directory("corral-runas-") as state:
        guests = (ALICE, BOB, GHOST)
        cluster = LocalCluster(
            state, getpass.getuser(), guests=guests, nodes=2, gpus_per_node=2, allow_root_jobs=False
        )
        try:
            config = cluster.prepare()
            assert not config.allow_root_jobs
            assert ensure_resolvable([n.name for n in config.nodes]) is None
            cluster.start(ready_timeout=90)
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture(scope="module")
def clis(cluster: LocalCluster, users: dict[str, UnixUser]) -> Iterator[dict[str, UserCli]]:
    """Each user's commands, run as them from their home directory."""
    with user_commands(users[ALICE]) as commands:
        yield {name: user_cli(cluster, user, commands) for name, user in users.items()}


def output_of(user: UnixUser, job: int) -> str:
    """The job's default output file (``slurm-%j.out`` in the submit directory), checked to be the
    owner's."""
    path = user.home / f"slurm-{job}.out"
    info = path.stat()
    assert (info.st_uid, info.st_gid) == (user.uid, user.gid), f"{path} is {info.st_uid}:{info.st_gid}"
    return path.read_text()


def test_each_job_runs_as_its_owner_with_their_groups_home_and_files(
    clis: dict[str, UserCli], users: dict[str, UnixUser]
) -> None:
    alice, bob = users[ALICE], users[BOB]
    secret = bob.home / "secret"
    secret.write_text("bob's\n")
    os.chown(secret, bob.uid, bob.gid)
    secret.chmod(0o600)
    script = IDENTITY.format(secret=secret)
    jobs = {name: clis[name].sbatch(script, "--export=NONE") for name in (ALICE, BOB)}
    for name, job in jobs.items():
        clis[name].wait_state(job, ("COMPLETED",))
        user = users[name]
        said = dict(line.split("=", 1) for line in output_of(user, job).splitlines() if "=" in line)
        assert said["user"] == name
        assert set(said["groups"].split()) == {str(g) for g in os.getgrouplist(name, user.gid)}
        assert said["home"].split()[0] == str(user.home)
        assert said["slurm"] == f"{name} {user.uid} {user.gid}"
        assert said["pwd"] == str(user.home)
        assert said["secret"] == ("read" if name == BOB else "refused")
    team = subprocess.run(["getent", "group", TEAM], capture_output=True, text=True, check=True)
    assert (
        team.stdout.split(":")[2] in output_of(alice, jobs[ALICE]).split("groups=")[1].split("\n")[0].split()
    )
    assert "user=ctest-alice logname=ctest-alice shell=/bin/bash" in output_of(alice, jobs[ALICE])


def test_an_srun_steps_tasks_run_as_the_owner_on_every_node(
    clis: dict[str, UserCli], users: dict[str, UnixUser]
) -> None:
    alice = users[ALICE]
    script = "#!/bin/bash\n#SBATCH -N 2 -n 2\nsrun -l id -un\nsrun -o step-%j-%t.out id -Gn\n"
    job = clis[ALICE].sbatch(script)
    clis[ALICE].wait_state(job, ("COMPLETED",), timeout=90)
    assert sorted(output_of(alice, job).split()) == ["0:", "1:", ALICE, ALICE]
    for task in (0, 1):
        step_file = alice.home / f"step-{job}-{task}.out"
        assert step_file.stat().st_uid == alice.uid
        assert TEAM in step_file.read_text().split()


def test_neither_user_can_cancel_the_others_job(clis: dict[str, UserCli]) -> None:
    alice, bob = clis[ALICE], clis[BOB]
    job = alice.sbatch(SLEEPER)
    alice.wait_state(job, ("RUNNING",))
    refused = bob("scancel", str(job))
    assert refused.returncode != 0
    assert f"Access/permission denied: job {job} belongs to {ALICE}" in refused.stderr, refused.stderr
    assert alice.sacct(job).startswith("RUNNING")
    assert alice("scancel", str(job)).returncode == 0
    alice.wait_state(job, ("CANCELLED",))


def test_roots_job_is_refused_where_the_configuration_does_not_allow_it(cluster: LocalCluster) -> None:
    root = Cli(env=user_env(cluster.state_dir), workdir=cluster.state_dir)
    refused = root("sbatch", "--parsable", stdin="#!/bin/bash\ntrue\n")
    assert refused.returncode != 0 and refused.stdout == ""
    assert "root may not submit jobs here" in refused.stderr, refused.stderr
    assert "set [cluster] allow_root_jobs = true" in refused.stderr


def test_a_job_of_a_user_no_node_knows_fails_to_launch_saying_so(cluster: LocalCluster) -> None:
    root = Cli(env=user_env(cluster.state_dir), workdir=Path("/tmp"))
    ghost = cli_as(root, cluster, cluster.credentials_of(GHOST))
    ran = Path("/tmp/corral-ghost-ran")
    ran.unlink(missing_ok=True)
    job = ghost.sbatch(f"#!/bin/bash\n#SBATCH -o /dev/null\ntouch {ran}\n")
    ghost.wait_state(job, ("FAILED",))
    shown = ghost("scontrol", "show", "job", str(job)).stdout
    assert re.search(
        r"Reason=LaunchFailed,_Invalid_user_id:_user_ctest-ghost_does_not_exist_on_node\d", shown
    ), shown
    assert not ran.exists()


def test_a_job_works_in_its_directory_as_its_owner(clis: dict[str, UserCli]) -> None:
    # root may enter /root, its owner may not: the job fails saying why, rather than running there as root
    alice = clis[ALICE]
    job = alice.sbatch("#!/bin/bash\n#SBATCH -o /dev/null\ntrue\n", "-D", "/root")
    alice.wait_state(job, ("FAILED",))
    shown = alice("scontrol", "show", "job", str(job)).stdout
    # (scontrol prints a reason's spaces as _, as Slurm does)
    reason = "Reason=LaunchFailed,_cannot_execute_the_batch_script:_chdir(/root):_Permission_denied"
    assert reason in shown, shown
