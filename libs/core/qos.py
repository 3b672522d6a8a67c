"""QOS and association limits as the pure core sees them (Slurm's sacctmgr QOS and association records).

A QOS (quality of service) gives jobs a priority factor, limits on what one user or the whole QOS may run
at once, a MaxWall, and the preemption settings read by the preemption planner with ``preempt_type =
"qos"``: ``preempt`` (the QOS its jobs may preempt), and what happens to its own jobs when they are
preempted (``preempt_mode``, ``grace_time_s``; None: the scheduler's defaults). A QOS named ``normal``
with no limits always exists, as in Slurm. Association limits sit on an account and count the running
jobs of the account and of every account below it (``grp_*``), or of one user in the account
(``max_*_per_user``).

Every limit is ``None`` when unlimited. GPU limits count GPUs (Slurm's ``gres/gpu`` TRES).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: What happens to a QOS's jobs when they are preempted (Slurm's PreemptMode; ``off``: never preempted).
PreemptMode = Literal["off", "requeue", "cancel"]

#: Slurm's default QOS, always present.
NORMAL = "normal"


@dataclass(frozen=True)
class QosPolicy:
    """One QOS."""

    name: str  # QOS name
    priority: int = 0  # Priority: the job's QOS factor is this over the highest QOS priority
    max_gres_per_user: int | None = None  # MaxTRESPerUser=gres/gpu: GPUs one user's running jobs hold
    max_jobs_per_user: int | None = None  # MaxJobsPerUser: running jobs of one user
    max_submit_jobs_per_user: int | None = None  # MaxSubmitJobsPerUser: pending + running (submit check)
    grp_gres: int | None = None  # GrpTRES=gres/gpu: GPUs of all running jobs of the QOS
    max_wall_s: int | None = None  # MaxWall: longest time limit of a job of the QOS
    preempt: tuple[str, ...] = ()  # Preempt: QOS whose jobs this QOS's jobs may preempt
    preempt_mode: PreemptMode | None = None  # PreemptMode of its jobs when preempted (None: the default)
    grace_time_s: int | None = None  # GraceTime of its preempted jobs, in seconds (None: the default)

    @property
    def limits_running(self) -> bool:
        """True if the QOS limits what may run at once (the scheduler has to count)."""
        return any(v is not None for v in (self.max_gres_per_user, self.max_jobs_per_user, self.grp_gres))


@dataclass(frozen=True)
class AssocLimits:
    """Limits of one account's association (and, per user, of its users' associations)."""

    account: str  # the account
    grp_gres: int | None = None  # GrpTRES=gres/gpu: GPUs of the running jobs of the account and below
    grp_jobs: int | None = None  # GrpJobs: running jobs of the account and below
    max_jobs_per_user: int | None = None  # MaxJobs: running jobs of one user in the account
    max_gres_per_user: int | None = None  # GrpTRES=gres/gpu of each user's association in the account
    max_submit_jobs_per_user: int | None = None  # MaxSubmitJobs: pending + running of a user (submit check)

    @property
    def limits_running(self) -> bool:
        """True if the association limits what may run at once."""
        return any(
            v is not None
            for v in (self.grp_gres, self.grp_jobs, self.max_jobs_per_user, self.max_gres_per_user)
        )
