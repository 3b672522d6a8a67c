"""The records the API's replies carry: one job, node, partition, share, priority, accounting record or
reservation as a service sees it, and the outcome per job of a cancel or control request.
"""

from __future__ import annotations

import msgspec

# --- outcomes (cancel, hold, release, update, requeue, signal) ------------------------------------------


class CancelOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What happened to one job of a cancel request."""

    job_id: int  # the job (the array's id for a task named by index)
    error: str | None = None  # None if the cancel request was recorded (or the job already ended)
    array_task_id: int | None = None  # the task's index when it was named as ``A_T``


class JobOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What happened to one job of a hold, release or update request."""

    job_id: int  # the job (the array's id for a task named by index)
    error: str | None = None  # None if the request was recorded; Slurm's wording otherwise
    array_task_id: int | None = None  # the task's index when it was named as ``A_T``


# --- jobs (squeue) --------------------------------------------------------------------------------------


class JobInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One job as the scheduler sees it now."""

    job_id: int  # id
    name: str  # job name
    user: str  # owner
    account: str  # account
    partition: str  # partition (requested or default)
    state: str  # JobState
    reason: str  # pending reason (Priority, Resources, ...) or "None"
    submit_time: float  # Unix time
    start_time: float | None  # Unix time of the current run's start
    end_time: float | None  # Unix time the job ended
    time_limit_s: int | None  # effective limit
    num_nodes: int  # nodes requested / allocated
    num_cpus: int  # CPUs requested / allocated
    num_tasks: int  # tasks
    gpus_per_node: int  # GPUs per node
    gpu_type: str | None  # GPU type requested
    min_memory_mb: int | None  # memory per node requested
    node_list: str  # compressed hostlist of the allocation ("" if pending)
    restart_count: int  # runs before the current one
    priority: int  # priority value (higher runs first)
    workdir: str  # submit directory
    exit_code: int = 0  # batch exit code (if ended)
    signal: int = 0  # terminating signal (if ended)
    dependency: str = ""  # Slurm's Dependency= text of the conditions not yet met, "" if none
    begin_time: float | None = None  # -b: Unix time before which the job may not start
    stdout: str | None = None  # -o pattern as submitted (None: slurm-%j.out)
    stderr: str | None = None  # -e pattern as submitted (None: with stdout)
    requeue: bool = True  # may be requeued
    array_job_id: int = 0  # the array's id for an array task (its first task's id), 0 otherwise
    array_task_id: int | None = None  # the task's index (SLURM_ARRAY_TASK_ID), None if not an array task
    array_throttle: int = 0  # the array's %P limit of running tasks, 0 = none
    # The indices of the array's pending tasks this row stands for, its own first (``collapse_arrays``: tasks
    # that never ran and show alike but for their id); empty: this job alone. A tuple: an empty one keeps
    # the struct out of the garbage collector's sight (a list made squeue's 50,000-job pages 40% slower).
    array_tasks: tuple[int, ...] = ()
    qos: str = ""  # the job's QOS (squeue %q)
    nice: int = 0  # the job's nice value (scontrol show job Nice=)
    switches: int = 0  # --switches count (most topology blocks), 0 = none
    switches_wait_s: int = 0  # how long the job waits for that count (capped by max_switch_wait)
    segment: int = 0  # --segment size (nodes per block-local segment), 0 = none
    run_started: bool = False  # the batch node's agent started the current run (RunStarted): steps may begin
    # scontrol show job's other fields (Slurm 22.05's record); the defaults print Slurm's unset values.
    command: str = ""  # Command=: the batch script's absolute path ("" = from stdin or --wrap: (null))
    features: str = ""  # Features=: the --constraint text ("" = none: (null))
    req_nodes: str = ""  # ReqNodeList=: the -w hostlist, compressed ("" = (null))
    exc_nodes: str = ""  # ExcNodeList=: the -x hostlist, compressed ("" = (null))
    reservation: str = ""  # Reservation=: the --reservation ("" = none: no line)
    exclusive: bool = False  # --exclusive: OverSubscribe=NO (else OK)
    ntasks_per_node: int = 0  # --ntasks-per-node (NtasksPerN:B:S:C=N:0:*:*), 0 = not given
    cpus_per_task: int = 0  # -c (CPUs/Task=), 0 = not known (num_cpus over num_tasks)
    gpus_per_task: int = 0  # --gpus-per-task (TresPerTask=gres:gpu:N), 0 = not given
    cpus_per_gpu: int = 0  # --cpus-per-gpu (CpusPerTres=gres:gpu:N), 0 = not given
    batch: bool = True  # BatchFlag=1: a batch job (False: an salloc/srun allocation, without StdOut/StdErr)
    alloc_node: str = ""  # AllocNode: the host sbatch ran on ("" = (null))
    last_sched_eval: float | None = None  # LastSchedEval=: the plan that last considered it (None: Unknown)


# --- priority (sprio) -----------------------------------------------------------------------------------


class PriorityFactors(msgspec.Struct, frozen=True, kw_only=True):
    """A pending job's priority factors, each already multiplied by its weight (sprio's columns)."""

    site: float = 0.0  # SITE: a site's own factor (0: Corral has no site factor)
    age: float = 0.0  # AGE: PriorityWeightAge x the age factor
    fairshare: float = 0.0  # FAIRSHARE: PriorityWeightFairshare x the fair-share factor
    job_size: float = 0.0  # JOBSIZE: PriorityWeightJobSize x the job-size factor
    partition: float = 0.0  # PARTITION: PriorityWeightPartition x the partition's tier factor
    qos: float = 0.0  # QOS: PriorityWeightQOS x the QOS factor
    nice: float = 0.0  # NICE: the job's nice value, subtracted


class LiveCount(msgspec.Struct, frozen=True, kw_only=True):
    """How many pending and running jobs a user has in one QOS and account (MaxSubmitJobs counts them)."""

    qos: str  # their QOS
    account: str  # the account they are charged to
    jobs: int  # how many


class JobPriority(msgspec.Struct, frozen=True, kw_only=True):
    """One pending job's priority and its factors."""

    job_id: int  # id
    user: str  # owner
    account: str  # account
    partition: str  # partition
    priority: int  # the priority it is scheduled with (0: held; an admin-set value when set)
    factors: PriorityFactors  # the weighted factors of its computed priority
    admin_set: bool = False  # the priority was set by an admin (scontrol update Priority=)
    array_job_id: int = 0  # the array's id for an array task, 0 otherwise
    array_task_id: int | None = None  # the task's index, None if not an array task
    tier: int = 1  # its partition's PriorityTier
    queue_priority: int = 0  # what the queue orders it by: its priority, also while held
    submit_time: float = 0.0  # when it was submitted (epoch seconds)

    def queue_key(self) -> tuple[int, int, float, int]:
        """Its place in the queue, least first: higher tier, then higher priority, earlier submission,
        smaller id (``libs/core/priority.queue_order``'s order), so that rows read in pages by id can be
        shown in the order the scheduler considers them."""
        return (-self.tier, -self.queue_priority, self.submit_time, self.job_id)


class PriorityWeightsInfo(msgspec.Struct, frozen=True, kw_only=True):
    """The configured priority weights (sprio -w)."""

    age: int  # PriorityWeightAge
    fairshare: int  # PriorityWeightFairshare
    job_size: int  # PriorityWeightJobSize
    partition: int  # PriorityWeightPartition
    qos: int = 0  # PriorityWeightQOS
    site: int = 0  # site factor weight


# --- shares (sshare) ------------------------------------------------------------------------------------


class ShareInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One association of the fair-share tree (an account, or a user in an account)."""

    account: str  # the account (a user row: the account the user charges)
    user: str  # the user, "" for an account row
    depth: int  # depth under root (root 0), for indenting
    raw_shares: int  # RawShares
    norm_shares: float  # NormShares: shares over the siblings' shares
    raw_usage: float  # RawUsage: decayed usage (TRES-seconds)
    effective_usage: float  # EffectvUsage: usage over the parent's usage
    fairshare: float | None  # FairShare factor of a user association; None for an account
    level_fs: float | None = None  # LevelFS (sshare -l); None = infinite (no usage)


# --- nodes (sinfo) --------------------------------------------------------------------------------------


class NodeInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One node's inventory and state."""

    name: str  # node name
    state: str  # idle | mixed | allocated | reserved | down | draining (jobs still run) | drained | unknown
    reason: str  # why down/drained ("" otherwise)
    cpus: int  # CPUs
    alloc_cpus: int  # allocated CPUs
    mem_mb: int  # memory MiB
    alloc_mem_mb: int  # allocated memory MiB
    gpus: int  # GPUs
    alloc_gpus: int  # allocated GPUs
    gpu_type: str | None  # GPU model
    partitions: list[str]  # partitions it belongs to
    features: list[str] = []  # features
    drained: bool = False  # a drain is set (admin or registration), whatever the state (DOWN+DRAIN)
    reason_user: str = ""  # who set the reason: the admin of a drain, "" when Corral did
    reason_time: float | None = None  # when the admin drained it (Unix seconds); None if not known
    admin_down: bool = False  # state down because an admin downed it (it responds: DOWN, not DOWN*)


class PartitionInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One partition's configuration."""

    name: str  # name
    default: bool  # the default partition
    max_time_s: int | None  # MaxTime (None = UNLIMITED)
    default_time_s: int | None  # DefaultTime
    nodes: list[str]  # configured node names
    priority_tier: int = 1  # PriorityTier (and PriorityJobFactor)
    max_nodes: int | None = None  # MaxNodes (None = UNLIMITED)
    qos: str = ""  # QoS= of its jobs without --qos ("" = N/A)
    allow_qos: list[str] = []  # AllowQos (empty: ALL)
    allow_accounts: list[str] = []  # AllowAccounts (empty: ALL)
    preempt_mode: str = "OFF"  # PreemptMode as Slurm spells it: OFF, CANCEL or REQUEUE
    grace_time_s: int = 0  # GraceTime of its preempted jobs, seconds


# --- acct (sacct) ---------------------------------------------------------------------------------------


class AcctStep(msgspec.Struct, frozen=True, kw_only=True):
    """One step of a job (``N.batch``, ``N.0``)."""

    step: str  # "batch" or a step number
    name: str  # step name ("batch" for the batch step)
    state: str  # step state
    exit_code: int  # exit code
    signal: int  # terminating signal
    start_time: float | None  # Unix time
    end_time: float | None  # Unix time
    node_list: str  # nodes of the step
    num_cpus: int  # CPUs
    num_tasks: int  # tasks
    num_gpus: int  # GPUs


class AcctAttempt(msgspec.Struct, frozen=True, kw_only=True):
    """An earlier run of a requeued job (``sacct -D`` shows it as a record of its own)."""

    attempt: int  # run number (SLURM_RESTART_COUNT of that run)
    state: str  # REQUEUED, NODE_FAIL or PREEMPTED (or the job's end, for its last run)
    partition: str  # partition of the run
    start_time: float  # Unix time of the allocation
    end_time: float | None  # Unix time it ended
    node_list: str  # nodes of the run
    num_nodes: int  # nodes
    num_cpus: int  # CPUs over all nodes
    num_gpus: int  # GPUs over all nodes
    mem_mb: int  # memory over all nodes, MiB
    exit_code: int  # exit code
    signal: int  # terminating signal
    reason: str  # requeue or end reason
    steps: list[AcctStep] = []  # the steps that ran in this run (batch first, then by number)


class AcctJob(msgspec.Struct, frozen=True, kw_only=True):
    """One job's accounting record."""

    job_id: int  # id
    name: str  # job name
    user: str  # owner
    account: str  # account
    partition: str  # partition
    state: str  # JobState of the job
    cancelled_by: str | None  # user who cancelled it (CANCELLED by <user>)
    exit_code: int  # batch exit code
    signal: int  # terminating signal
    submit_time: float  # Unix time
    start_time: float | None  # Unix time of the last run's start
    end_time: float | None  # Unix time the job ended
    time_limit_s: int | None  # limit
    num_nodes: int  # nodes
    num_cpus: int  # CPUs allocated (requested if never ran)
    num_gpus: int  # GPUs allocated in total
    node_list: str  # nodes of the last run
    restart_count: int  # requeues
    workdir: str  # submit directory
    reason: str  # end or pending reason
    steps: list[AcctStep] = []  # steps, batch first
    array_job_id: int | None = None  # the array's id for an array task, None otherwise
    array_task_id: int | None = None  # the task's index for an array task, None otherwise
    qos: str = ""  # the job's QOS ("" = submitted before jobs carried one)
    req_nodes: int = 0  # nodes requested (ReqTRES node=)
    req_cpus: int = 0  # CPUs requested
    req_gpus: int = 0  # GPUs requested over all nodes
    req_mem_mb: int | None = None  # memory requested over all nodes, MiB (None = the partition's default)
    alloc_mem_mb: int = 0  # memory of the latest run over all nodes, MiB
    gpu_type: str = ""  # the requested GPU type (gpu:h100:2); "" = any
    attempts: list[AcctAttempt] = []  # earlier runs, oldest first (only with ``AcctRequest.duplicates``)


# --- reservations (scontrol show reservation) -----------------------------------------------------------


class ReservationInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One reservation as the scheduler knows it."""

    name: str  # ReservationName
    start_time: float  # StartTime
    end_time: float  # EndTime
    nodes: list[str]  # nodes, sorted
    gpus: int  # GPUs reserved in all (0: whole nodes)
    partition: str  # PartitionName
    users: list[str]  # Users=
    accounts: list[str]  # Accounts=
    flags: list[str]  # Flags=
    active: bool  # State=ACTIVE (the window has begun) or INACTIVE
