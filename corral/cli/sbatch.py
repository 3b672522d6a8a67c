"""``sbatch``: submit a batch script; prints exactly ``Submitted batch job N`` (or ``N`` with ``--parsable``).

With ``--test-only`` the job is validated as a submission would be and the scheduler's estimate of its start
is printed on stderr in Slurm's words; nothing is submitted.

Whether the job's output files can be created is checked here too, as the user (``sbatch_output.py``).
The script is read and copied here, at submit time, so the caller may delete it as soon as sbatch
returns. A submission carries a random token; the one retry after a timeout reuses it, so the gateway
can tell a retry from a new job and a slow cluster never gets the job twice.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from corral.cli.errors import CliError, run_command, warn
from corral.cli.options import version_text
from corral.cli.sbatch_args import build_submission, parse_command_line
from corral.cli.sbatch_output import check_output_paths
from corral.cli.sbatch_script import MAX_SCRIPT_BYTES
from corral.schemas.events import JobSpec

if TYPE_CHECKING:
    from corral.cli.client import Cluster
    from corral.schemas.api import WillRunReply

COMMAND = "sbatch"
#: A service account (CI) submits for a user by naming them here; Slurm's ``--uid`` is root's, not this.
ON_BEHALF_OF = "CORRAL_ON_BEHALF_OF"

USAGE = """\
Usage: sbatch [OPTIONS...] [SCRIPT [ARGS...]]   (the script is read from stdin when not given)

  -J, --job-name=NAME         name of the job (default: the script's file name)
  -o, --output=PATTERN        stdout file (%j job id, %x name, %u user, %N node, %A array id, %a task
                              index; default slurm-%j.out, slurm-%A_%a.out for array tasks)
  -e, --error=PATTERN         stderr file (default: with stdout)
      --open-mode=MODE        append or truncate the output files
  -p, --partition=NAME        partition          -A, --account=NAME     account
  -N, --nodes=N               number of nodes    -n, --ntasks=N         number of tasks
  -c, --cpus-per-task=N       CPUs per task          --ntasks-per-node=N tasks per node
  -t, --time=TIME             time limit (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S)
      --mem=SIZE              memory per node (500M, 8G)   --mem-per-cpu=SIZE, --mem-per-gpu=SIZE
      --gres=gpu[:TYPE][:N]   GPUs per node          --gpus-per-node=[TYPE:]N
      --requeue, --no-requeue allow or forbid requeueing after a node failure
      --signal=[B:]SIG[@T]    send SIG T seconds (default 60) before the time limit (B: batch shell only)
  -d, --dependency=LIST       start after other jobs: after|afterok|afternotok|afterany:ID[:ID...],
                              joined by , (all of) or ? (any of); or singleton
  -H, --hold                  submit held (JobHeldUser) until 'scontrol release'
  -b, --begin=TIME            not before TIME: now+60, now+1hour, HH:MM[:SS], YYYY-MM-DD[THH:MM[:SS]]
  -a, --array=INDEXES[%MAX]   a job array, one job per index (0-999%32, 1-7:2, 1,3,5-9; indices 0-1000),
                              at most MAX of them running at once; the id printed is the array's
  -D, --chdir=DIR             working directory of the job (default: the current directory)
      --export=ALL|NONE|[ALL,]VAR[=VALUE],...   environment to export (default ALL)
      --wrap=COMMAND          run COMMAND in a /bin/sh script instead of a script file
      --parsable              print only the job id
      --test-only             validate the job and tell when it would start; submit nothing
  -h, --help                  this help          -V, --version          version

Environment: CORRAL_ON_BEHALF_OF=USER  a service account's submission for USER (its scope must allow it)
"""


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``sbatch``."""
    return run_command(COMMAND, _sbatch, argv)


def _sbatch(argv: list[str]) -> int:
    invocation = parse_command_line(argv)
    if invocation.args.given("help") or invocation.args.given("usage"):
        sys.stdout.write(USAGE)
        return 0
    if invocation.args.given("version"):
        print(version_text())
        return 0
    data = None if invocation.wrap is not None else read_script(invocation.script_path)
    try:
        cwd = os.getcwd()
    except OSError as exc:
        raise CliError(f"cannot tell the current directory: {exc.strerror}") from None
    # the node name is what socket.gethostname() returns, without loading socket (~5 ms)
    submission = build_submission(invocation, data, environ=os.environ, cwd=cwd, hostname=os.uname().nodename)
    for message in submission.warnings:
        warn(COMMAND, message)
    # A service account's submission for a user (CI): the gateway checks the service account's scope.
    on_behalf_of = os.environ.get(ON_BEHALF_OF, "").strip() or None
    if on_behalf_of is None:
        # Here, as the job's user: whether the output files can be created where -o/-e put them (for
        # another user, the agent finds out at launch, as that user).
        check_output_paths(submission.spec)
    from corral.cli.client import find_cluster

    if submission.test_only:
        estimate = test_only(find_cluster(), submission.spec, on_behalf_of)
        sys.stderr.write(f"{COMMAND}: {will_run_line(estimate)}\n")
        return 0
    job_id = submit(find_cluster(), submission.spec, on_behalf_of=on_behalf_of)
    print(job_id if submission.parsable else f"Submitted batch job {job_id}")
    return 0


def will_run_line(estimate: WillRunReply) -> str:
    """Slurm's --test-only report: ``Job N to start at TIME using C processors on nodes L in partition P``."""
    if estimate.start is None:
        return (
            f"Job {estimate.job_id} is not expected to start within the backfill window "
            f"(Reason={estimate.reason or 'Resources'}) in partition {estimate.partition}"
        )
    from corral.libs.slurm.hostlist import compress
    from corral.libs.slurm.timefmt import format_timestamp

    nodes = f" on nodes {compress(estimate.nodes)}" if estimate.nodes else ""
    return (
        f"Job {estimate.job_id} to start at {format_timestamp(estimate.start)} using {estimate.cpus} "
        f"processors{nodes} in partition {estimate.partition}"
    )


def test_only(cluster: Cluster, spec: JobSpec, on_behalf_of: str | None = None) -> WillRunReply:
    """Have the job validated and its start estimated (``sbatch --test-only``); nothing is submitted."""
    import uuid

    from corral.schemas.api import SubmitRequest, WillRunReply

    request = SubmitRequest(token=uuid.uuid4().hex, spec=spec, test_only=True, on_behalf_of=on_behalf_of)
    try:
        return cluster.call("submit", request, WillRunReply)
    except CliError as exc:
        raise CliError(f"Job submit/allocate failed: {exc.message}") from None


def read_script(path: str | None) -> bytes:
    """The script's bytes from ``path`` or stdin, at most one byte over the limit (so it can be refused)."""
    if path is None:
        return sys.stdin.buffer.read(MAX_SCRIPT_BYTES + 1)
    try:
        with open(path, "rb") as script:
            return script.read(MAX_SCRIPT_BYTES + 1)
    except OSError:
        raise CliError(f"Unable to open file {path}") from None


def submit(cluster: Cluster, spec: JobSpec, token: str | None = None, on_behalf_of: str | None = None) -> int:
    """Submit ``spec`` and return its job id; one retry after a timeout, with the same token."""
    import uuid

    from corral.cli.client import CallTimeout
    from corral.schemas.api import SubmitReply, SubmitRequest

    request = SubmitRequest(token=token or uuid.uuid4().hex, spec=spec, on_behalf_of=on_behalf_of)
    try:
        try:
            reply = cluster.call("submit", request, SubmitReply)
        except CallTimeout:
            reply = cluster.call("submit", request, SubmitReply)
    except CliError as exc:
        raise CliError(f"Batch job submission failed: {exc.message}") from None
    return reply.job_id


if __name__ == "__main__":
    sys.exit(main())
