"""What the simulator does with each event type: every type is a decision it reacts to, an event it writes
itself, or one it deliberately never sees (``tests/unit/test_lifecycle.py`` checks the three cover the log).

The simulator plays the workload, the agents and the scheduler's shell; there is no gateway, no health
service and no step in it, so their events never occur. A decision the core makes that is not in
``REACTIONS`` is a ``SimError``: a new kind of decision cannot be silently dropped.
"""

from __future__ import annotations

from typing import Literal

from corral.schemas import events as ev
from corral.schemas.lifecycle import WRITERS

#: What a cycle does after folding a decision: ``start`` schedules the run's end, ``preempt`` schedules the
#: victim's kill, ``settle`` records an ended job (or plans again if the job is still live), ``resv`` just
#: folds it (a reservation).
Reaction = Literal["start", "preempt", "settle", "resv"]

#: The reaction to each decision the core may make.
REACTIONS: dict[type, Reaction] = {
    ev.JobAllocated: "start",
    ev.JobPreempted: "preempt",
    ev.JobCompleted: "settle",
    ev.JobFailed: "settle",
    ev.JobCancelled: "settle",
    ev.JobRequeued: "settle",
    ev.JobHeld: "settle",
    ev.JobReleased: "settle",
    ev.JobUpdated: "settle",
    ev.ReservationCreated: "resv",
    ev.ReservationRejected: "resv",
    ev.ReservationDeleted: "resv",
}

#: The events the simulator writes itself: the workload's submissions, the nodes' registrations and the
#: batch nodes' exit reports.
WRITES: dict[type, str] = {
    ev.JobSubmitted: "the workload, at each job's submit time",
    ev.NodeRegistered: "the cluster, at the first submit time",
    ev.RunExited: "a run's batch node, at its end (or its kill)",
}

_NO_GATEWAY = "an intent: there is no gateway (no user acts after submitting)"
#: The events that never occur in a simulation, and why.
IGNORED: dict[type, str] = {
    # every gateway intent but the submission, which the simulator makes itself (lifecycle.WRITERS)
    **dict.fromkeys(
        (t for t, writer in WRITERS.items() if writer == "gateway" and t is not ev.JobSubmitted), _NO_GATEWAY
    ),
    ev.RunStarted: "the core decides nothing from a script's start; a run counts from its allocation",
    ev.StepStarted: "no steps: a simulated run is one batch script",
    ev.StepExited: "no steps: a simulated run is one batch script",
    **dict.fromkeys(
        (ev.NodeDown, ev.NodeUp, ev.NodeDrained, ev.NodeResumed, ev.NodeHealthReported),
        "no health service: nodes never fail",
    ),
    ev.JobReasonChanged: "the simulator plays plan(), not the shell's reason log: nothing decides from it",
}
