"""``corral audit``: a job's full history from the log, one line per event, with who and why.

    corral audit 42                 # job 42: every event, its actor, what changed and why
    corral audit 12_3               # the task of array 12 with index 3 (or by its own job id)
    corral audit --node node2       # node2's events and the job events that name it (auditor, admin)
    corral audit --user alice       # every event of alice's jobs
    corral audit 42 --json          # the same as data, with each entry's envelope

A user may audit their own jobs; the auditor and admin roles every job, node and user. Anything else is
refused by the gateway, naming the job and the rule (exit status 1). The cluster and the credentials are
found as for the other commands (``client.py``): the auditor role's file is
``<state>/credentials/roles/corral-auditor.json`` on a local cluster (``CORRAL_CREDENTIALS``).
The text is ``audit_format.render``; the model is Flux's ``flux job eventlog``.
"""

from __future__ import annotations

import argparse
import sys

from corral.cli.audit_format import as_json, render
from corral.cli.client import find_cluster
from corral.cli.errors import CliError, run_command
from corral.cli.jobrefs import one_job_ref
from corral.schemas import api
from corral.schemas.api_requests import MAX_HISTORY

COMMAND = "corral audit"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=COMMAND,
        description="Print a job's history from the log: time, event, actor, what changed and why.",
    )
    parser.add_argument("job_id", nargs="?", help="the job: N, or an array task as A_T or by its own id")
    parser.add_argument("--node", help="the history of a node instead (auditor and admin roles)")
    parser.add_argument("--user", help="the history of a user's jobs instead")
    parser.add_argument("--json", action="store_true", help="print JSON for tools")
    parser.add_argument(
        "--limit", type=int, default=1000, help=f"at most this many events, the newest (1-{MAX_HISTORY})"
    )
    return parser


def request_of(args: argparse.Namespace) -> api.HistoryRequest:
    """The history request the arguments ask for; CliError naming the argument if they are wrong."""
    given = [a for a in (args.job_id, args.node, args.user) if a is not None]
    if len(given) != 1:
        raise CliError("give exactly one of a job id, --node NAME and --user NAME")
    if not 1 <= args.limit <= MAX_HISTORY:
        raise CliError(f"--limit must be 1-{MAX_HISTORY}, not {args.limit}")
    if args.job_id is not None:
        ref = one_job_ref(args.job_id, "job id")
        task = None if ref.tasks is None else ref.tasks[0]
        return api.HistoryRequest(job_id=ref.job_id, array_task=task, limit=args.limit)
    return api.HistoryRequest(node=args.node, user=args.user, limit=args.limit)


def _audit(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    request = request_of(args)
    reply = find_cluster().history(request)
    if args.json:
        sys.stdout.buffer.write(as_json(reply))
        return 0
    if not reply.entries:
        what = f"job {args.job_id}" if args.job_id else f"node {args.node}" if args.node else ""
        print(f"no events for {what or 'user ' + str(args.user)}", file=sys.stderr)
        return 0
    sys.stdout.write(render(reply, jobs=request.job_id is None))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``corral audit``."""
    return run_command(COMMAND, _audit, argv)
