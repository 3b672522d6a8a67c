"""Generate the JSON Schema files in ``schemas/jsonschema/`` from the Structs.

Run ``python -m corral.schemas.generate`` after changing a Struct; a test fails when the checked-in
files are stale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from corral.schemas import api, events, feed, steps

SCHEMA_DIR = Path(__file__).parent / "jsonschema"

#: file name -> the type it describes
DOCUMENTS: dict[str, Any] = {
    "envelope.json": events.Envelope,
    "api-request.json": api.Request,
    "api-reply.json": api.SubmitReply
    | api.SubmitBatchReply
    | api.WillRunReply
    | api.CancelReply
    | api.JobsReply
    | api.NodesReply
    | api.AcctReply
    | api.ReportReply
    | api.ControlReply
    | api.PriorityReply
    | api.LiveCountsReply
    | api.SharesReply
    | api.ReservationReply
    | api.ReservationsReply
    | api.NodeUpdateReply
    | api.HistoryReply
    | api.PingReply
    | api.ApiError,
    "order.json": api.Order,
    "step.json": steps.StepRequest | steps.StepLaunched | steps.StepDone | steps.StepPolled,
    "step-exit.json": steps.TaskExit,
    # What a DCGM-style exporter publishes on corral.ext.health.<reporter>.<node> (docs/integrations.md).
    "health-report.json": events.NodeHealthReported,
    # The job event feed's messages (``corral.feed.v1.>``); a new version is a new file.
    "feed-v1.json": feed.FeedMessage,
}


def render() -> dict[str, str]:
    """The text of every schema file."""
    out: dict[str, str] = {}
    for name, typ in DOCUMENTS.items():
        schema = msgspec.json.schema(typ)
        out[name] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return out


def main() -> int:
    """Write the files; with --check, exit 1 if any is stale instead."""
    check = "--check" in sys.argv[1:]
    stale = []
    for name, text in render().items():
        path = SCHEMA_DIR / name
        if path.exists() and path.read_text() == text:
            continue
        stale.append(name)
        if not check:
            path.write_text(text)
    if check and stale:
        print(f"stale JSON Schema: {', '.join(stale)}; run python -m corral.schemas.generate")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
