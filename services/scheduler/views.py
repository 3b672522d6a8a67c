"""What ``squeue``, ``sinfo`` and ``scontrol show reservation`` see: views of the scheduler's state (pure)."""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import astuple
from operator import attrgetter

from corral.libs.config.cluster import ClusterConfig

# The policy is built in a lib the simulator shares; re-exported for the service's callers.
from corral.libs.config.policy import policy_of as policy_of
from corral.libs.config.policy import usage_policy_of as usage_policy_of
from corral.libs.config.tables import NodeConfig
from corral.libs.core.eligibility import dependency_text
from corral.libs.core.limits import qos_name
from corral.libs.core.plan import Plan
from corral.libs.core.policy import Policy
from corral.libs.core.priority import priority_factors, total
from corral.libs.core.reasons import end_text, held_reason
from corral.libs.core.reservations import live
from corral.libs.core.state import Job, Node, State, array_tasks, array_throttle, drain_reason, drained
from corral.libs.core.topology import switch_wait_s
from corral.libs.slurm import hostlist
from corral.libs.slurm.constraint import format_constraint
from corral.schemas import api
from corral.schemas.codec import MAX_REPLY_BYTES, encode, page
from corral.services.scheduler import array_rows
from corral.services.scheduler.owners import Owners

#: How long an ended job stays visible to squeue when the fold keeps every job (``State.min_job_age_s`` 0);
#: otherwise for as long as the fold keeps it (Slurm's MinJobAge).
MIN_JOB_AGE_S = 300.0


def job_info(
    job: Job, outlook: Plan, policy: Policy, dependency: str = "", priority: int | None = None
) -> api.JobInfo:
    """One job for squeue; a pending job's reason, priority and planned start come from the last plan.

    ``dependency`` is the Slurm text of its unmet dependencies (``eligibility.dependency_text``);
    ``priority`` that of a job no longer pending (``started_priorities``; None: 0).
    """
    # A hold is state: shown at once, even before the next plan.
    held = held_reason(job)
    reason = outlook.reason_text(job.job_id) if held is None else held
    spec = job.spec
    running = bool(job.allocations) and job.state == "RUNNING"
    nodes = [a.node for a in job.allocations]
    return api.JobInfo(
        job_id=job.job_id,
        name=spec.name,
        user=job.user,
        account=spec.account or job.user,
        partition=job.partition or policy.partition_of(job),
        state=job.state,
        reason=reason if job.state == "PENDING" else end_text(job),
        submit_time=job.submit_time,
        start_time=job.start_time if job.state != "PENDING" else outlook.starts.get(job.job_id),
        end_time=job.end_time,
        time_limit_s=job.time_limit_s if running else policy.time_limit(job),
        num_nodes=len(nodes) if nodes else spec.nodes,
        num_cpus=sum(a.cpus for a in job.allocations) if nodes else spec.ntasks * spec.cpus_per_task,
        num_tasks=spec.ntasks,
        gpus_per_node=spec.gpus_per_node,
        gpu_type=spec.gpu_type,
        min_memory_mb=spec.mem_per_node_mb,
        node_list=hostlist.compress(nodes) if nodes else "",
        restart_count=job.restart_count,
        priority=(0 if job.held else outlook.priorities.get(job.job_id, 1))
        if job.state == "PENDING"
        else priority or 0,
        workdir=spec.workdir,
        exit_code=job.exit_code,
        signal=job.signal,
        dependency=dependency,
        begin_time=spec.begin_time,
        stdout=spec.stdout,
        stderr=spec.stderr,
        requeue=spec.requeue,
        array_job_id=job.array_job_id,
        array_task_id=job.array_task_id,
        array_throttle=array_throttle(job),
        qos=qos_name(policy, job),
        nice=spec.nice,
        switches=spec.switches or 0,
        switches_wait_s=0 if spec.switches is None else switch_wait_s(spec, policy.max_switch_wait_s),
        segment=spec.segment or 0,
        run_started=running and job.run_started,
        command=spec.command or "",
        features=format_constraint(spec.constraint) if spec.constraint else "",
        req_nodes=hostlist.compress(spec.nodelist) if spec.nodelist else "",
        exc_nodes=hostlist.compress(spec.exclude) if spec.exclude else "",
        reservation=spec.reservation or "",
        exclusive=spec.exclusive,
        ntasks_per_node=spec.ntasks_per_node or 0,
        cpus_per_task=spec.cpus_per_task,
        gpus_per_task=spec.gpus_per_task or 0,
        cpus_per_gpu=spec.cpus_per_gpu or 0,
        batch=not spec.interactive,
        alloc_node=spec.submit_host,
        last_sched_eval=(outlook.at if job.state == "PENDING" else job.start_time) or None,
    )


def started_priorities(state: State, now: float, policy: Policy, jobs: list[Job]) -> dict[int, int]:
    """The priority scontrol shows for jobs no longer pending: Slurm keeps the one a job started with;
    Corral does not store it and shows the same multifactor sum computed now (an admin's when set)."""
    computed: dict[int, int] = {}
    weighted = any(astuple(policy.weights)[:4]) or policy.weights.qos or any(j.spec.nice for j in jobs)
    if jobs and weighted:
        computed = {i: total(f) for i, f in priority_factors(state, now, policy, jobs).items()}
    return {
        j.job_id: j.priority_override if j.priority_override is not None else computed.get(j.job_id, 1)
        for j in jobs
    }


def jobs_reply(
    state: State,
    outlook: Plan,
    policy: Policy,
    req: api.JobsRequest,
    now: float,
    owners: Owners | None = None,
    order: JobOrder | None = None,
) -> api.JobsReply:
    """The jobs matching a squeue request: live ones, and recently ended ones when asked by id; by id, from
    ``req.after_job_id`` on, as many as ``MAX_REPLY_BYTES`` hold (``more`` if some are left: at least one a
    page, so that paging always ends).

    An array's id asks for every task of the array, as in Slurm. ``owners``: each user's jobs, for a request
    that names users (``owners.py``; without, a pass over every job). ``order``: the state's job ids in
    order, kept by the caller for a request that names neither jobs nor users (without, a pass over every
    job and a sort, for each page).
    """
    wanted = set(req.job_ids)
    window = state.min_job_age_s or MIN_JOB_AGE_S
    after = req.after_job_id

    def kept(job: Job) -> bool:
        if wanted and job.job_id not in wanted and job.array_job_id not in wanted:
            return False
        live = job.state in ("PENDING", "RUNNING")
        recent = job.end_time is not None and now - job.end_time <= window
        if not live and not ((wanted or req.include_finished) and recent):
            return False
        return not req.users or job.user in req.users

    shown: Iterable[Job]
    if order is not None and not wanted and not req.users:
        # Every job: by id from the page's first, taken as the page needs them (``JobOrder``).
        ids, not_pending = order.of(state)
        jobs = state.jobs
        first = bisect.bisect_right(ids, after)
        shown = filter(kept, map(jobs.__getitem__, itertools.islice(ids, first, None)))
        first = bisect.bisect_right(not_pending, after, key=_job_id)
        started = [j for j in itertools.islice(not_pending, first, None) if kept(j)]
    else:
        candidates = _candidates(state, wanted, req.users, owners)
        shown = sorted((j for j in candidates if j.job_id > after and kept(j)), key=_job_id)
        started = [j for j in shown if j.state != "PENDING"]
    priorities = started_priorities(state, now, policy, started)

    def info(job: Job) -> api.JobInfo:
        return job_info(job, outlook, policy, dependency_text(state, job), priorities.get(job.job_id))

    def matches(info: api.JobInfo) -> bool:
        return (not req.partitions or info.partition in req.partitions) and (
            not req.states or info.state in req.states
        )

    if req.collapse_arrays:  # an array's alike pending tasks as one row (``array_rows.py``)
        units = (
            ([i for row in unit.rows if matches(i := array_rows.info_of(row, info(row.job)))], unit.last_id)
            for unit in array_rows.units(shown, outlook, lambda job: dependency_text(state, job))
        )
        out, more, last = array_rows.page_units(units, MAX_REPLY_BYTES)
        return api.JobsReply(jobs=out, more=more, last_job_id=last)
    out, more = page((i for i in map(info, shown) if matches(i)), MAX_REPLY_BYTES)
    return api.JobsReply(jobs=out, more=more)


class JobOrder:
    """The state's job ids in order, and its jobs that are not pending by id, for one log position: the pages
    of a listing of every job (``squeue``) each start where the last ended, instead of each passing over
    every job and sorting what is left (quadratic in the jobs: 400,000 pending took 8.7 s of pages, a
    million about a minute, on every scheduler). Built again once the state moved (another object, entry or
    job count)."""

    def __init__(self) -> None:
        self._key: tuple[int, int, int] | None = None
        self._ids: list[int] = []
        self._not_pending: list[Job] = []

    def of(self, state: State) -> tuple[list[int], list[Job]]:
        """(every job id, in order; the jobs not pending, by id)."""
        key = (id(state), state.last_seq, len(state.jobs))
        if key != self._key:
            jobs = state.jobs
            self._ids = sorted(jobs)
            self._not_pending = sorted((j for j in jobs.values() if j.state != "PENDING"), key=_job_id)
            self._key = key
        return self._ids, self._not_pending


def _candidates(
    state: State, wanted: set[int], users: Sequence[str] = (), owners: Owners | None = None
) -> Iterable[Job]:
    """The jobs a request for ``wanted`` ids (or of ``users``) may match, all of them when it names neither:
    each named job and, for an array's id, its tasks (``array_tasks``), looked up instead of passing over
    every job of the state; every job if one is not there (a forgotten array's id may still name tasks kept
    longer). Else the jobs of ``users`` from ``owners``. srun asks for its job 50 times a second while it
    waits, users watch ``squeue --me``, every scheduler answers, and the state holds every job of the last
    ``min_job_age``."""
    if not wanted:
        if users and owners is not None:
            return owners.jobs(state, users)
        return state.jobs.values()
    jobs = state.jobs
    if not all(job_id in jobs for job_id in wanted):
        return jobs.values()
    found = {job_id: jobs[job_id] for job_id in wanted}
    for job_id in wanted:
        for task in array_tasks(state, job_id):
            found[task.job_id] = task
    return found.values()


def live_counts_reply(
    state: State, policy: Policy, req: api.LiveCountsRequest, owners: Owners | None = None
) -> api.LiveCountsReply:
    """The user's pending and running jobs counted by QOS and account: what the gateway's MaxSubmitJobs
    check needs at each submission, a few numbers instead of every live job of the user (a ``jobs`` reply of
    thousands of jobs, in pages). ``owners``: each user's jobs (without, a pass over every job)."""
    user = req.user
    jobs = owners.held(state, user) if owners is not None else state.jobs.values()
    counts = Counter(
        (qos_name(policy, job), job.spec.account or user)
        for job in jobs
        if job.user == user and job.state in _LIVE
    )
    ordered = sorted(counts.items())
    return api.LiveCountsReply(counts=[api.LiveCount(qos=q, account=a, jobs=n) for (q, a), n in ordered])


#: The states a job counts in MaxSubmitJobs.
_LIVE = frozenset(("PENDING", "RUNNING"))

#: A job's id (in C).
_job_id = attrgetter("job_id")


def node_state(node: Node) -> str:
    """Slurm's node state name derived from usage and availability."""
    if not node.up:
        return "down"
    if drained(node):
        return "draining" if node.jobs else "drained"
    if not node.jobs:
        return "idle"
    full = node.alloc_cpus >= node.cpus or (node.gpus > 0 and len(node.used_gpus) >= node.gpus)
    return "allocated" if full else "mixed"


def _shown_state(node: Node, reserved: set[str]) -> str:
    """A node's state for sinfo: ``reserved`` for an idle node an active reservation holds."""
    state = node_state(node)
    return "reserved" if state == "idle" and node.name in reserved else state


def reservations_reply(state: State, req: api.ReservationsRequest, now: float) -> api.ReservationsReply:
    """The reservations not over at ``now`` (only the named ones if any are), by name."""
    out = []
    for resv in live(state, now):
        if req.names and resv.name not in req.names:
            continue
        out.append(
            api.ReservationInfo(
                name=resv.name,
                start_time=resv.start_time,
                end_time=resv.end_time,
                nodes=list(resv.nodes),
                gpus=sum(resv.gpus),
                partition=resv.partition,
                users=list(resv.users),
                accounts=list(resv.accounts),
                flags=list(resv.flags),
                active=resv.start_time <= now,
            )
        )
    return api.ReservationsReply(reservations=out)


def nodes_reply(
    state: State, config: ClusterConfig, req: api.NodesRequest, now: float | None = None
) -> api.NodesReply:
    """The configured nodes (registered or not) by name, from the first after ``req.after_node`` on, as many
    as ``MAX_REPLY_BYTES`` hold with every partition (``more`` if some are left), and every partition.

    An idle node that an active reservation holds whole shows ``reserved`` (sinfo's ``resv``) when ``now``
    is given.
    """
    reserved = set()
    if now is not None:
        reserved = {n for r in live(state, now) if r.start_time <= now and not r.gpus for n in r.nodes}
    partitions = [
        api.PartitionInfo(
            name=p.name,
            default=p is config.default_partition,
            max_time_s=p.max_time_s,
            default_time_s=p.default_time_s,
            nodes=list(p.nodes),
            priority_tier=p.priority_tier,
            max_nodes=p.max_nodes,
            qos=p.qos or "",
            allow_qos=list(p.allow_qos),
            allow_accounts=list(p.allow_accounts),
            preempt_mode=_preempt_mode(config, p.preempt_mode),
            grace_time_s=int(
                p.grace_time_s if p.grace_time_s is not None else config.scheduler.preempt_grace_time_s
            ),
        )
        for p in config.partitions
        if not req.partitions or p.name in req.partitions
    ]
    wanted = set(req.partitions)
    names = config.names
    start = bisect.bisect_right(names, req.after_node) if req.after_node else 0
    infos = (
        _node_info(state, config.nodes[config.node_index[name]], parts, reserved)
        for name in itertools.islice(names, start, None)
        for parts in (config.partitions_of(name),)
        if not wanted or not wanted.isdisjoint(parts)
    )
    bound = MAX_REPLY_BYTES - len(encode(partitions))  # every page carries the partitions
    nodes, more = page(infos, max(bound, 1))
    return api.NodesReply(nodes=nodes, partitions=partitions, more=more)


def _node_info(state: State, conf: NodeConfig, parts: list[str], reserved: set[str]) -> api.NodeInfo:
    """One configured node as sinfo shows it: as it registered, or ``unknown`` until it does."""
    node = state.nodes.get(conf.name)
    if node is None:
        return api.NodeInfo(
            name=conf.name,
            state="unknown",
            reason="Not registered",
            cpus=conf.cpus,
            alloc_cpus=0,
            mem_mb=conf.mem_mb,
            alloc_mem_mb=0,
            gpus=conf.gpus,
            alloc_gpus=0,
            gpu_type=conf.gpu_type,
            partitions=parts,
            features=list(conf.features),
        )
    # The reason shown is the admin's drain unless the node is down (its down reason comes first, with the
    # admin who downed it).
    drain = node.admin_drain if node.up else node.admin_down
    return api.NodeInfo(
        name=node.name,
        state=_shown_state(node, reserved),
        reason=node.reason or drain_reason(node),
        cpus=node.cpus,
        alloc_cpus=node.alloc_cpus,
        mem_mb=node.mem_mb,
        alloc_mem_mb=node.alloc_mem_mb,
        gpus=node.gpus,
        alloc_gpus=len(node.used_gpus),
        gpu_type=node.gpu_type,
        partitions=parts,
        features=list(node.features),
        drained=drained(node),
        reason_user=drain.by if drain else "",
        reason_time=drain.at if drain else None,
        admin_down=node.admin_down is not None,
    )


def _preempt_mode(config: ClusterConfig, mode: str | None) -> str:
    """A partition's PreemptMode as Slurm prints it: OFF without preemption, else its own or the cluster's."""
    if config.scheduler.preempt_type == "off":
        return "OFF"
    return (mode or config.scheduler.preempt_mode).upper()
