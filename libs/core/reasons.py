"""Why a pending job waits: Slurm's reason codes, as one type (pure).

Each cycle records the reason of every pending job it does not start (``Plan.reasons``, squeue's REASON
column); the step that stops a job names it. As in Slurm (a job's ``state_reason`` and ``state_desc``),
a reason is a code, and ``ReqNodeNotAvail`` carries a detail that squeue prints after it
(``Plan.reason_text``): ``UnavailableNodes:<hostlist>`` or ``Reserved for maintenance``.

By who sets them:

- eligibility (``eligibility.py``, in this order): ``JobHeldUser``, ``JobHeldAdmin``,
  ``DependencyNeverSatisfied``, ``Dependency``, ``BeginTime``;
- a job array's ``%P``: ``JobArrayTaskLimit``;
- QOS and association limits (``limits.py``): ``InvalidQOS``, ``QOSMaxGRESPerUser``,
  ``QOSMaxJobsPerUserLimit``, ``QOSGrpGRES``, ``AssocMaxJobsLimit``, ``AssocGrpGRES``,
  ``AssocGrpJobsLimit``;
- its partition's limits (a job the gateway accepted with ``enforce_part_limits = NO``, or submitted before
  the partition changed): ``PartitionNodeLimit``, ``PartitionTimeLimit``, ``PartitionConfig``;
- nodes it names (``-w``) down or drained, or a maintenance reservation: ``ReqNodeNotAvail``;
- the queue: ``Resources`` (the first job of its partition that does not fit), ``Priority`` (behind it);
- advance reservations (``reservations.py``): ``Reservation``, ``ReservationDeleted``.

A job that is not pending has no such reason; a failed one shows its EndReason and the failure's detail
(``end_text``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# The type is the log's (``JobReasonChanged`` carries it); re-exported for the cycle's steps.
from corral.schemas.job_events import PendingReason as PendingReason

if TYPE_CHECKING:
    # Types only: squeue's commands import this module and should not load the state's.
    from corral.libs.core.state import Job


#: Reasons of a job that is not eligible yet: it is never placed, blocks nobody, has no EligibleTime.
INELIGIBLE: frozenset[PendingReason] = frozenset(
    {"JobHeldUser", "JobHeldAdmin", "DependencyNeverSatisfied", "Dependency", "BeginTime"}
)

#: The detail of ``ReqNodeNotAvail`` for an outsider while a MAINT reservation holds nodes of its partition.
MAINTENANCE = "Reserved for maintenance"


def held_reason(job: Job) -> PendingReason | None:
    """The reason of a held job (``sbatch -H``, ``scontrol hold``: by its user or an admin), else None."""
    if not job.held:
        return None
    return "JobHeldAdmin" if job.held == "admin" else "JobHeldUser"


def unavailable(nodes: str) -> str:
    """The detail of ``ReqNodeNotAvail`` for a job that names nodes (a hostlist) that are down or drained."""
    return f"UnavailableNodes:{nodes}"


def text(reason: str, detail: str = "") -> str:
    """A reason as squeue shows it: the code, and its detail after a comma."""
    return f"{reason}, {detail}" if detail else reason


def end_text(job: Job) -> str:
    """The Reason of a job that is not pending, as squeue and scontrol show it: ``None``, but for a failed
    job its EndReason and the conclusion's detail (``LaunchFailed, cannot open output file /w/1.out: ...``),
    so that a job that never started says why and names the path at fault."""
    return text(job.end_reason, job.end_message) if job.end_reason else "None"
