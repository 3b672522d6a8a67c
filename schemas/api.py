"""API messages (``corral.api.v1.<verb>.<user>``, request/reply); per-node orders are in ``orders.py``
(re-exported here).

Every reply is either the verb's reply Struct or an ``ApiError``; both are tagged, so a client
decodes ``Reply | ApiError``. The caller's identity is never in a request body: it is the last
token of the subject, which the NATS server binds to the authenticated connection.

The requests are in ``api_requests.py``, the replies in ``api_replies.py`` and the records replies carry (a
job, a node, an accounting record ...) in ``api_views.py``; every one of them is re-exported here.
"""

from __future__ import annotations

from typing import Literal

from corral.schemas import lifecycle
from corral.schemas.api_replies import (
    AcctReply,
    ApiError,
    CancelReply,
    ControllerInfo,
    ControlReply,
    HistoryEntry,
    HistoryReply,
    JobsReply,
    LiveCountsReply,
    NodesReply,
    NodeUpdateReply,
    PingReply,
    PriorityReply,
    ReservationReply,
    ReservationsReply,
    SharesReply,
    SubmitBatchReply,
    SubmitReply,
    WillRunReply,
)
from corral.schemas.api_report import (
    AssocUsage,
    ReportReply,
    ReportRequest,
    ReportTres,
    TresCapacity,
    TresUsage,
)
from corral.schemas.api_requests import (
    AcctRequest,
    ArrayTasks,
    CancelRequest,
    CreateReservationRequest,
    DeleteReservationRequest,
    HistoryRequest,
    HoldRequest,
    JobsRequest,
    LiveCountsRequest,
    NodesRequest,
    NodeStateChange,
    NodeUpdateRequest,
    PingRequest,
    PriorityRequest,
    ReleaseRequest,
    Request,
    RequeueRequest,
    ReservationsRequest,
    SharesRequest,
    SignalRequest,
    SubmitBatchRequest,
    SubmitRequest,
    UpdateRequest,
    WillRunRequest,
)
from corral.schemas.api_views import (
    AcctAttempt,
    AcctJob,
    AcctStep,
    CancelOutcome,
    JobInfo,
    JobOutcome,
    JobPriority,
    LiveCount,
    NodeInfo,
    PartitionInfo,
    PriorityFactors,
    PriorityWeightsInfo,
    ReservationInfo,
    ShareInfo,
)
from corral.schemas.events import JobSpec, SignalScope
from corral.schemas.lifecycle import TERMINAL_STATES
from corral.schemas.orders import KillOrder, LaunchOrder, Order, SignalOrder, order_msg_id

# The messages of the submodules, and the names this module always re-exported, are its interface.
__all__ = [
    "TERMINAL_STATES",
    "VERBS",
    "AcctAttempt",
    "AcctJob",
    "AcctReply",
    "AcctRequest",
    "AcctStep",
    "ApiError",
    "ArrayTasks",
    "AssocUsage",
    "CancelOutcome",
    "CancelReply",
    "CancelRequest",
    "ControlReply",
    "ControllerInfo",
    "CreateReservationRequest",
    "DeleteReservationRequest",
    "HistoryEntry",
    "HistoryReply",
    "HistoryRequest",
    "HoldRequest",
    "JobInfo",
    "JobOutcome",
    "JobPriority",
    "JobSpec",
    "JobState",
    "JobsReply",
    "JobsRequest",
    "KillOrder",
    "LaunchOrder",
    "LiveCount",
    "LiveCountsReply",
    "LiveCountsRequest",
    "NodeInfo",
    "NodeStateChange",
    "NodeUpdateReply",
    "NodeUpdateRequest",
    "NodesReply",
    "NodesRequest",
    "Order",
    "PartitionInfo",
    "PingReply",
    "PingRequest",
    "PriorityFactors",
    "PriorityReply",
    "PriorityRequest",
    "PriorityWeightsInfo",
    "ReleaseRequest",
    "ReportReply",
    "ReportRequest",
    "ReportTres",
    "Request",
    "RequeueRequest",
    "ReservationInfo",
    "ReservationReply",
    "ReservationsReply",
    "ReservationsRequest",
    "ShareInfo",
    "SharesReply",
    "SharesRequest",
    "SignalOrder",
    "SignalRequest",
    "SignalScope",
    "SubmitBatchReply",
    "SubmitBatchRequest",
    "SubmitReply",
    "SubmitRequest",
    "TresCapacity",
    "TresUsage",
    "UpdateRequest",
    "WillRunReply",
    "WillRunRequest",
    "order_msg_id",
]

#: A job's state as shown by squeue and sacct: the fold's ``lifecycle.JobState`` and, for a batch step whose
#: run was requeued, REQUEUED.
JobState = Literal[lifecycle.JobState, "REQUEUED"]


#: API verbs and the service that answers each.
VERBS: dict[str, str] = {
    "submit": "gateway",
    "submit_batch": "gateway",
    "cancel": "gateway",
    "hold": "gateway",
    "release": "gateway",
    "update": "gateway",
    "requeue": "gateway",
    "signal": "gateway",
    "jobs": "scheduler",
    "will_run": "scheduler",
    "nodes": "scheduler",
    "priority": "scheduler",
    "live_counts": "scheduler",
    "shares": "scheduler",
    "acct": "accounting",
    "report": "accounting",
    "create_reservation": "gateway",
    "delete_reservation": "gateway",
    "reservations": "scheduler",
    "update_node": "gateway",
    "history": "gateway",
    "ping": "scheduler",
}
