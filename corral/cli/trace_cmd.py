"""``corral trace <jobid>``: a job's span tree, derived from the log, in the terminal (``--json`` for tools).

    corral trace 12            # the tree: start offsets, durations, a bar per span, span events
    corral trace 12 --json     # {"job_id": 12, "trace_id": ..., "spans": [SpanRecord, ...]}
    corral trace 12_3          # an array task: A_T, or its own job id (the JSON's job_id is its own id)

In a terminal (or with ``COLUMNS`` set) the tree fits its width: the timeline narrows and the span events
wrap; into a pipe it keeps its fixed layout (``libs/trace/render.py``).

The spans are those the tracer exports (``libs/trace/derive.py``, same ids), so this works on a cluster with
no tracing backend. The job's entries come from ``job_history.job_entries`` (the gateway's ``history`` verb:
a user may trace their own jobs, the auditor and admin roles every job).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time

import msgspec

from corral.cli.errors import CliError, run_command
from corral.cli.job_history import job_entries
from corral.cli.jobrefs import one_job_ref
from corral.libs.trace import derive
from corral.libs.trace.render import render
from corral.libs.trace.spans import ns

COMMAND = "corral trace"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMMAND, description="Show a job's trace, derived from the log.")
    parser.add_argument("job_id", help="the job: N, or an array task as A_T or by its own id")
    parser.add_argument("--json", action="store_true", help="the spans as JSON")
    return parser


def _trace(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    job_id, entries, last_at = job_entries(one_job_ref(args.job_id, "job id"))
    spans = derive.spans(job_id, entries)
    if not spans:
        raise CliError(f"job {args.job_id} is not in the log")
    if args.json:
        body = {"job_id": job_id, "trace_id": spans[0].trace_id, "spans": spans}
        sys.stdout.buffer.write(msgspec.json.encode(body) + b"\n")
        return 0
    # COLUMNS, else the terminal's width; 0 (neither: a pipe) keeps the fixed layout
    width = shutil.get_terminal_size((0, 0)).columns or None
    sys.stdout.write(render(job_id, spans, ns(max(last_at, time.time())), width))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``corral trace``."""
    return run_command(COMMAND, _trace, argv)
