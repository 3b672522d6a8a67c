"""``scontrol show job [ID]``: Slurm's multi-line ``Key=Value`` record of each job (``-o``: one line each).

The records come from the scheduler's ``jobs`` verb. Rendering is pure (``show_job``, ``output_path``); the
user's uid and group are looked up on this machine (``local_user``), ``(null)`` when it does not know them.
"""

from __future__ import annotations

import posixpath
import re
import sys
import time
from collections.abc import Callable, Sequence
from datetime import tzinfo
from typing import TYPE_CHECKING

from corral.cli.errors import CliError
from corral.cli.jobrefs import ids_of, named, parse_job_refs
from corral.libs.core.reasons import INELIGIBLE
from corral.libs.slurm import hostlist
from corral.libs.slurm.memory import format_memory
from corral.libs.slurm.timefmt import format_elapsed_sacct, format_timestamp

if TYPE_CHECKING:
    from corral.schemas.api import JobInfo

#: Resolves a user name to ``(uid, group name, gid)``; None if the machine does not know it.
UserLookup = Callable[[str], "tuple[int, str, int] | None"]


def show(words: Sequence[str], oneliner: bool) -> int:
    """``scontrol show job [ID]``: every live job (or the one named), one record each; the exit status."""
    from corral.cli.client import find_cluster
    from corral.schemas.api import JobsRequest

    if len(words) > 1:
        raise CliError(f"unexpected argument '{words[1]}' after the job id")
    refs = parse_job_refs([words[0]], "job id") if words else []
    found = find_cluster().jobs(JobsRequest(job_ids=ids_of(refs)))
    jobs = [job for job in found if named(refs, job.job_id, job.array_job_id, job.array_task_id)]
    if refs and not jobs:
        raise CliError("slurm_load_jobs error: Invalid job id specified")
    if not jobs:
        print("No jobs in the system")
        return 0
    now = time.time()
    out = []
    for job in jobs:
        lines = show_job(job, now, local_user)
        out.append(record(lines, oneliner))
    sys.stdout.write("".join(out))
    return 0


def record(lines: Sequence[str], oneliner: bool) -> str:
    """One job's record as Slurm prints it: each field line ends with the separator, the last one too
    (a line of three spaces, or a trailing space with ``-o``), then a blank line (a newline with ``-o``)."""
    end = " " if oneliner else "\n   "
    return "".join(line + end for line in lines) + ("\n" if oneliner else "\n\n")


def local_user(user: str) -> tuple[int, str, int] | None:
    """``(uid, group name, gid)`` of a local user, None if this machine does not know the name."""
    import grp
    import pwd

    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return None
    try:
        group = grp.getgrgid(entry.pw_gid).gr_name
    except KeyError:
        group = str(entry.pw_gid)
    return entry.pw_uid, group, entry.pw_gid


def show_job(job: JobInfo, now: float, lookup: UserLookup, tz: tzinfo | None = None) -> list[str]:
    """The lines of ``scontrol show job`` for one job: Slurm 22.05's keys, order and unset values.

    What Corral has no notion of prints what Slurm prints when unset (``MCS_label=N/A``, ``Reboot=0``,
    ``Licenses=(null)``, ``Power=``); Slurm's optional lines (``BatchHost``, ``Reservation``,
    ``TresPerNode`` ...) appear only when the job has the value, as in Slurm.
    """
    ids = lookup(job.user)
    user = f"{job.user}({ids[0]})" if ids else job.user
    group = f"{ids[1]}({ids[2]})" if ids else "(null)"
    pending = job.state == "PENDING"
    array = []
    if job.array_task_id is not None:
        array = [f"ArrayJobId={job.array_job_id} ArrayTaskId={job.array_task_id}"]
        if job.array_throttle:
            array[0] += f" ArrayTaskThrottle={job.array_throttle}"
    cpus_per_task = job.cpus_per_task or max(job.num_cpus // max(job.num_tasks, 1), 1)
    nodes = "(null)" if pending or not job.node_list else job.node_list
    return [
        f"JobId={job.job_id} {array[0] + ' ' if array else ''}JobName={job.name}",
        f"UserId={user} GroupId={group} MCS_label=N/A",
        f"Priority={job.priority} Nice={job.nice} Account={job.account} QOS={job.qos or 'normal'}",
        f"JobState={job.state} Reason={_reason(job.reason)} Dependency={job.dependency or '(null)'}",
        f"Requeue={int(job.requeue)} Restarts={job.restart_count} BatchFlag={int(job.batch)} Reboot=0 "
        f"ExitCode={job.exit_code}:{job.signal}",
        f"RunTime={format_elapsed_sacct(_run_time(job, now))} TimeLimit={_limit(job.time_limit_s)} "
        "TimeMin=N/A",
        f"SubmitTime={format_timestamp(job.submit_time, tz)} EligibleTime={_eligible(job, tz)}",
        f"AccrueTime={_accrue(job, tz)}",
        f"StartTime={format_timestamp(job.start_time, tz)} EndTime={_end(job, tz)} Deadline=N/A",
        "SuspendTime=None SecsPreSuspend=0 "
        f"LastSchedEval={format_timestamp(job.last_sched_eval, tz)} Scheduler=Main",
        f"Partition={job.partition} AllocNode:Sid={job.alloc_node or '(null)'}:0",
        f"ReqNodeList={job.req_nodes or '(null)'} ExcNodeList={job.exc_nodes or '(null)'}",
        f"NodeList={nodes}",
        *([f"BatchHost={hostlist.first(job.node_list)}"] if job.node_list and not pending else []),
        f"NumNodes={job.num_nodes} NumCPUs={job.num_cpus} NumTasks={job.num_tasks} "
        f"CPUs/Task={cpus_per_task} ReqB:S:C:T=0:0:*:*",
        f"TRES={_tres(job)}",
        f"Socks/Node=* NtasksPerN:B:S:C={job.ntasks_per_node}:0:*:* CoreSpec=*",
        f"MinCPUsNode={cpus_per_task * max(job.ntasks_per_node, 1)} "
        f"MinMemoryNode={format_memory(job.min_memory_mb or 0)} MinTmpDiskNode=0",
        f"Features={job.features or '(null)'} DelayBoot=00:00:00",
        *([f"Reservation={job.reservation}"] if job.reservation else []),
        f"OverSubscribe={'NO' if job.exclusive else 'OK'} Contiguous=0 Licenses=(null) Network=(null)",
        f"Command={job.command or '(null)'}",
        f"WorkDir={job.workdir}",
        *_files(job),
        *_topology(job),
        "Power=",
        *_tres_per(job),
    ]


def _files(job: JobInfo) -> list[str]:
    """``StdErr=``, ``StdIn=``, ``StdOut=`` of a batch job (Slurm prints none for an salloc/srun job)."""
    if not job.batch:
        return []
    default = "slurm-%j.out" if job.array_task_id is None else "slurm-%A_%a.out"
    stdout = output_path(job.stdout or default, job)
    stderr = output_path(job.stderr, job) if job.stderr else stdout
    return [f"StdErr={stderr}", "StdIn=/dev/null", f"StdOut={stdout}"]


def _tres_per(job: JobInfo) -> list[str]:
    """Slurm's optional GPU lines, in its order: ``CpusPerTres=``, ``TresPerNode=``, ``TresPerTask=``.

    Slurm 22.05 spells a GPU request ``gres:gpu[:type]:N`` in them (``gres/gpu`` only in ``TRES=``).
    """
    gpu = f"gres:gpu:{job.gpu_type}" if job.gpu_type else "gres:gpu"
    lines = [f"CpusPerTres={gpu}:{job.cpus_per_gpu}"] if job.cpus_per_gpu else []
    if job.gpus_per_task:
        return [*lines, f"TresPerTask={gpu}:{job.gpus_per_task}"]
    if job.gpus_per_node:
        lines.append(f"TresPerNode={gpu}:{job.gpus_per_node}")
    return lines


def _topology(job: JobInfo) -> list[str]:
    """Slurm's optional ``Switches=N@wait`` line (with ``SegmentSize=`` for --segment); none without them."""
    parts = []
    if job.switches:
        parts.append(f"Switches={job.switches}@{format_elapsed_sacct(job.switches_wait_s)}")
    if job.segment:
        parts.append(f"SegmentSize={job.segment}")
    return [" ".join(parts)] if parts else []


def output_path(pattern: str, job: JobInfo) -> str:
    """An output pattern with ``%j %J %A %a %x %u %N %%`` filled in, made absolute against the workdir.

    ``%N`` (the batch node) stays as is while the job has no node, as in Slurm; ``%A``/``%a`` are the
    array's id and the task's index for an array task (``%A`` is the job id otherwise, ``%a`` stays).
    """
    first = hostlist.first(job.node_list) if job.node_list else "%N"
    task = job.array_task_id
    values = {"j": str(job.job_id), "J": str(job.job_id), "x": job.name, "u": job.user}
    values |= {"A": str(job.array_job_id if task is not None else job.job_id)}
    values |= {"N": first, "%": "%"} | ({"a": str(task)} if task is not None else {})
    out = []
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if char == "%" and index + 1 < len(pattern) and pattern[index + 1] in values:
            out.append(values[pattern[index + 1]])
            index += 2
            continue
        out.append(char)
        index += 1
    return posixpath.join(job.workdir, "".join(out))


def _run_time(job: JobInfo, now: float) -> int:
    if job.start_time is None or job.state == "PENDING":
        return 0
    end = job.end_time if job.end_time is not None else now
    return max(0, int(end - job.start_time))


def _limit(seconds: int | None) -> str:
    return "UNLIMITED" if seconds is None else format_elapsed_sacct(seconds)


def _eligible(job: JobInfo, tz: tzinfo | None) -> str:
    if job.begin_time is not None:
        return format_timestamp(job.begin_time, tz)
    if job.state == "PENDING" and job.reason in INELIGIBLE:
        return "Unknown"
    return format_timestamp(job.submit_time, tz)


def _reason(reason: str) -> str:
    """``Reason=``: Slurm replaces white space in a reason's description with ``_``, for easier parsing."""
    return re.sub(r"\s", "_", reason) if reason else "None"


def _accrue(job: JobInfo, tz: tzinfo | None) -> str:
    """``AccrueTime=``: when the job began to age, its eligible time (``Unknown`` while it may not start)."""
    if job.state == "PENDING" and job.reason in INELIGIBLE:
        return "Unknown"
    return format_timestamp(job.begin_time if job.begin_time is not None else job.submit_time, tz)


def _end(job: JobInfo, tz: tzinfo | None) -> str:
    if job.end_time is not None:
        return format_timestamp(job.end_time, tz)
    if job.state == "RUNNING" and job.start_time is not None and job.time_limit_s is not None:
        return format_timestamp(job.start_time + job.time_limit_s, tz)
    return "Unknown"


def _tres(job: JobInfo) -> str:
    parts = [f"cpu={job.num_cpus}", f"node={job.num_nodes}", f"billing={job.num_cpus}"]
    if job.min_memory_mb:
        parts.insert(1, f"mem={format_memory(job.min_memory_mb * job.num_nodes)}")
    if job.gpus_per_node:
        parts.append(f"gres/gpu={job.gpus_per_node * job.num_nodes}")
    return ",".join(parts)
