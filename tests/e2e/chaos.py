"""The chaos harness: a load of short jobs on ``corral up --ha`` while processes are killed in turn, and the
invariants checked afterwards. Used by ``test_e2e_chaos.py`` (bounded, in CI) and ``bench/chaos_soak.py``
(longer, its figures in ``bench/RESULTS.md``).

Each job writes one line when it starts and one when it ends (its id, restart count, node, the GPUs it was
given and the wall-clock time), so the checks see what really ran, not only what the services say:

- every accepted job ended (or is still queued or running when the run is cut short);
- no job was created twice (the ids are distinct and ``sacct`` has one row for each);
- no job has two overlapping runs;
- no GPU of a node was held by two jobs at once;
- ``sacct`` agrees with the scheduler (``squeue``/``scontrol``) for every job;
- no running job was requeued because a service died (one attempt each).
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import os
import random
import signal
import socket
import threading
import time
from collections import defaultdict
from pathlib import Path

from e2e_cli import Cli
from test_e2e_supervision import Up, child_pid

from corral.services.scheduler.views import MIN_JOB_AGE_S

SCRIPT = """#!/bin/bash
out={out}/$SLURM_JOB_ID.$SLURM_RESTART_COUNT
mark() {{ echo "$1 $SLURM_JOB_ID $SLURM_RESTART_COUNT $SLURMD_NODENAME ${{CUDA_VISIBLE_DEVICES:-none}}"; }}
echo "$(mark start) $(date +%s.%N)" >> "$out"
{steps}
sleep {sleep}
echo "$(mark end) $(date +%s.%N)" >> "$out"
"""
#: A two-node job's step reports the GPUs of every node.
STEP = (
    "srun -N {nodes} bash -c "
    + "'echo \"gpus $SLURM_JOB_ID $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES\"'"
    + ' >> "$out.gpus"'
)

#: What is killed, by the name corral up reports it by, in this order: the services, an agent, PostgreSQL, the
#: leading scheduler, a NATS server of the three, the standby that took over, then ``pause:leader``: the
#: scheduler leading by then (as ``scontrol ping`` says) is paused (SIGSTOP) for ``PAUSE_S``, past its lease,
#: and resumed (SIGCONT): the other takes over, and what the paused one still tries once it runs again is
#: fenced.
TARGETS = [
    "gateway",
    "accounting",
    "health",
    "agent-node1",
    "postgres",
    "scheduler",
    "corral-nats-2",
    "leader",  # the scheduler leading then: the one that took over, unless the NATS server's loss moved it
    "pause:leader",
]
#: Seconds a paused process stays stopped: well past the schedulers' lease (3 s).
PAUSE_S = 8.0


@dataclasses.dataclass
class Figures:
    """What a chaos run counted."""

    accepted: list[int] = dataclasses.field(default_factory=list)
    refused: list[tuple[float, str]] = dataclasses.field(default_factory=list)  # (when, error): retried
    kills: list[tuple[str, float]] = dataclasses.field(default_factory=list)  # (name, seconds until back)
    began: list[float] = dataclasses.field(default_factory=list)  # when each kill (or pause) began
    leader_lost: list[float] = dataclasses.field(default_factory=list)  # when a leading scheduler was lost

    def refused_in(self, i: int) -> int:
        """The sbatch calls refused in disruption ``i``'s window (from it to the next one)."""
        end = self.began[i + 1] if i + 1 < len(self.began) else float("inf")
        return sum(1 for at, _ in self.refused if self.began[i] <= at < end)


class Chaos:
    """Load and kills on one ``corral up --ha``."""

    def __init__(self, up: Up, cli: Cli, out: Path, seed: int = 1) -> None:
        self.up, self.cli, self.out = up, cli, out
        self.random = random.Random(seed)
        self.figures = Figures()
        self.paused: list[str] = []  # the processes paused, by name

    def submit(self, jobs: int, pause_s: float = 0.2) -> None:
        """Submit ``jobs`` short jobs (some on two nodes, most with GPUs), retrying refused submits."""
        for _ in range(jobs):
            nodes = 2 if self.random.random() < 0.25 else 1
            gpus = self.random.choice([0, 1, 1, 2])
            steps = STEP.format(nodes=nodes) if nodes == 2 else ""
            script = SCRIPT.format(out=self.out, steps=steps, sleep=self.random.choice([1, 2, 3]))
            options = ["--parsable", "-N", str(nodes), "-o", "/dev/null"]
            if gpus:
                options.append(f"--gres=gpu:{gpus}")
            deadline = time.monotonic() + 60
            while True:
                result = self.cli("sbatch", *options, stdin=script)
                if result.returncode == 0:
                    self.figures.accepted.append(int(result.stdout))
                    break
                self.figures.refused.append((time.time(), result.stderr.strip()))
                if time.monotonic() > deadline:
                    raise AssertionError(f"no submit accepted in 60 s: {result.stderr}")
                time.sleep(0.5)
            time.sleep(pause_s)

    def needle(self, name: str) -> str:
        """What only ``name``'s command line holds: a service's metrics port (two gateways differ only
        there), a NATS server's config file, the postmaster's data directory option."""
        if name.startswith("corral-nats-"):
            return f"nats-{name.rsplit('-', 1)[1]}/nats.conf"
        if name == "postgres":
            return "postgres -D "  # the postmaster: "postgres" alone is in other command lines too
        urls = json.loads((self.up.state / "metrics.json").read_text())
        return f"--metrics-port {urls[name].rsplit(':', 1)[1].split('/')[0]} "

    def kill(self, name: str) -> None:
        """SIGKILL one process of the cluster (``leader``: the scheduler leading then) and wait until corral
        up has it running again (``pause:NAME``: stop it for ``PAUSE_S``, then let it go on)."""
        if name.startswith("pause:"):
            self.pause(name.removeprefix("pause:"))
            return
        target, name = name, self.leader() if name == "leader" else name
        leading = name.startswith("scheduler") and self.leader() == name
        mark = len(self.up.lines)
        started = time.monotonic()
        self.figures.began.append(time.time())
        if leading:
            self.figures.leader_lost.append(time.time())
        rebuilt = self.rebuilds(name)
        os.kill(child_pid(self.up.proc.pid, self.needle(name)), signal.SIGKILL)
        self.up.wait_line(f"{name} is running again", timeout=120, after=mark)
        self.figures.kills.append((target, time.monotonic() - started))
        if name.startswith("scheduler"):
            self.wait_standby(name, rebuilt)

    def logged(self, pattern: str, event: str) -> list[float]:
        """When ``event`` was logged by the services whose logs match ``pattern`` (``scheduler*``), sorted. A
        line still being written (it does not decode yet) is skipped: the services are running."""
        times = []
        for path in (self.up.state / "logs").glob(f"{pattern}.log"):
            for text in path.read_text().splitlines():
                if not text.startswith("{"):
                    continue
                try:
                    line = json.loads(text)
                except json.JSONDecodeError:
                    continue
                if line.get("event") == event:
                    times.append(datetime.datetime.fromisoformat(line["timestamp"]).timestamp())
        return sorted(times)

    def rebuilds(self, name: str) -> int:
        """How many times scheduler ``name`` has rebuilt its state (``state rebuilt``): once per start."""
        return len(self.logged(name, "state rebuilt"))

    def wait_standby(self, name: str, before: int, timeout: float = 60.0) -> None:
        """Wait until scheduler ``name``, started again, has rebuilt its state: from then on it polls the
        lease, and takes it when the leader is lost. (Its process runs again within a second, but its
        start-up on a loaded machine can take seconds more; losing the leader before then leaves nobody
        to take over, which is not what the next disruption tests.)"""
        deadline = time.monotonic() + timeout
        while self.rebuilds(name) <= before:
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} did not rebuild its state within {timeout} s of its restart")
            time.sleep(0.2)

    def leader(self, timeout: float = 30.0) -> str:
        """The leading scheduler's process name: ``scontrol ping``'s primary (the host, or ``<host>-2``), once
        one is up (the lease of a scheduler just killed names it until the lease lapses)."""
        deadline = time.monotonic() + timeout
        while True:
            ping = self.cli("scontrol", "ping").stdout.splitlines()
            up = [
                line.split(" at ")[1].split()[0] for line in ping if "(primary)" in line and "is UP" in line
            ]
            if up:
                return "scheduler-2" if up[0] == f"{socket.gethostname()}-2" else "scheduler"
            if time.monotonic() > deadline:
                raise AssertionError(f"no scheduler leads after {timeout} s: {ping}")
            time.sleep(0.5)

    def pause(self, target: str) -> None:
        """SIGSTOP one process (``leader``: the leading scheduler) for ``PAUSE_S`` seconds, then SIGCONT: it
        was not dead, so nobody restarts it."""
        name = self.leader() if target == "leader" else target
        pid = child_pid(self.up.proc.pid, self.needle(name))
        self.figures.began.append(time.time())
        if name.startswith("scheduler"):
            self.figures.leader_lost.append(time.time())
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(PAUSE_S)
        finally:
            os.kill(pid, signal.SIGCONT)
        self.figures.kills.append((f"pause:{target}", PAUSE_S))
        self.paused.append(name)

    def failovers(self) -> list[float]:
        """Seconds from each loss of the leading scheduler (killed or paused) to the next time a scheduler
        took the lease (its log's ``took the scheduler lease``: it plans at once)."""
        taken = self.logged("scheduler*", "took the scheduler lease")
        lost = [t for t in self.figures.leader_lost if taken and taken[-1] > t]
        return [next(t for t in taken if t > at) - at for at in lost]

    def run(self, jobs: int, targets: list[str], spacing_s: float) -> Figures:
        """Submit while killing each target in turn, ``spacing_s`` apart."""
        load = threading.Thread(target=self.submit, args=(jobs,))
        load.start()
        try:
            for name in targets:
                time.sleep(spacing_s)
                self.kill(name)
        finally:
            load.join()
        return self.figures

    def wait_ended(self, timeout: float = 300) -> dict[int, str]:
        """Every accepted job's sacct state once none is pending or running."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.states()
            if all(s not in ("PENDING", "RUNNING", "REQUEUED") for s in states.values()):
                return states
            if time.monotonic() > deadline:
                return states
            time.sleep(1)

    def states(self) -> dict[int, str]:
        rows = self.cli("sacct", "-X", "-n", "-P", "-o", "JobID,State", "-S", "2020-01-01").stdout.split()
        found: dict[int, str] = {}
        for row in rows:
            job, _, state = row.partition("|")
            assert int(job) not in found, f"sacct has job {job} twice"
            found[int(job)] = state.split(" ")[0]
        return found

    def check(self) -> list[str]:
        """The invariants; each broken one as a sentence (none: all hold)."""
        problems: list[str] = []
        accepted = self.figures.accepted
        if len(set(accepted)) != len(accepted):
            problems.append("a job id was given twice")
        states = self.states()
        if sorted(states) != sorted(accepted):
            problems.append(
                f"sacct's jobs {sorted(set(states) ^ set(accepted))} differ from the accepted ones"
            )
        missing = sorted({j for j, state in states.items() if state == "COMPLETED"} - self.recorded())
        ended, now = self.ended(), time.time()
        if missing:
            problems.append(f"completed jobs {missing} left no record of their run")
        for job in accepted:
            state = states.get(job, "missing")
            if state not in ("COMPLETED", "PENDING", "RUNNING"):
                problems.append(f"job {job} ended {state}")
            attempts = self.cli("sacct", "-j", str(job), "-D", "-X", "-n", "-P", "-o", "State").stdout.split()
            if len(attempts) != 1:
                problems.append(f"job {job} has {len(attempts)} attempts: {attempts} (requeued by a crash?)")
            view = self.cli("scontrol", "show", "job", str(job)).stdout
            if not view and state == "COMPLETED" and ended.get(job, now) < now - MIN_JOB_AGE_S:
                continue  # forgotten by the scheduler (squeue and scontrol) after MinJobAge, as in Slurm
            if f"JobState={state}" not in view:
                problems.append(f"sacct says {state} for job {job}; scontrol: {view.split()[:8]}")
        problems += self._overlaps()
        return problems

    def ended(self) -> dict[int, float]:
        """When each job's last run wrote its end line (wall clock)."""
        found: dict[int, float] = {}
        for path in self.out.glob("*.*"):
            lines = [line.split() for line in path.read_text().splitlines()] if path.suffix != ".gpus" else []
            for words in lines:
                if words[0] == "end":
                    found[int(words[1])] = max(found.get(int(words[1]), 0.0), float(words[5]))
        return found

    def recorded(self) -> set[int]:
        """The jobs whose run left its start and end lines."""
        found = set()
        for path in self.out.glob("*.*"):
            words = path.read_text().split()
            if path.suffix != ".gpus" and "start" in words and "end" in words:
                found.add(int(path.name.split(".")[0]))
        return found

    def _overlaps(self) -> list[str]:
        """Runs of a job that overlap, and GPUs held by two jobs at once, from the jobs' own lines."""
        runs: dict[int, list[tuple[float, float]]] = defaultdict(list)
        held: dict[tuple[str, str], list[tuple[float, float, int]]] = defaultdict(list)
        for path in self.out.glob("*.*"):
            if path.suffix == ".gpus":
                continue
            lines = [line.split() for line in path.read_text().splitlines()]
            start = next((x for x in lines if x[0] == "start"), None)
            end = next((x for x in lines if x[0] == "end"), None)
            if start is None or end is None:
                continue
            job, begin, finish = int(start[1]), float(start[5]), float(end[5])
            runs[job].append((begin, finish))
            # The batch node's GPUs, and every node's from the step of a two-node job (during the run).
            seen = {(start[3], start[4])}
            steps = path.with_name(path.name + ".gpus")
            if steps.exists():
                seen |= {
                    (x[2], x[3])
                    for x in (line.split() for line in steps.read_text().splitlines())
                    if len(x) == 4
                }
            for node, gpus in seen:
                for gpu in gpus.split(",") if gpus != "none" else []:
                    held[(node, gpu)].append((begin, finish, job))
        problems = []
        for job, spans in runs.items():
            spans.sort()
            if any(b < a_end for (_, a_end), (b, _) in itertools.pairwise(spans)):
                problems.append(f"job {job} ran twice at once: {spans}")
        for (node, gpu), spans in held.items():
            spans.sort()
            for (_, a_end, a), (b, _, other) in itertools.pairwise(spans):
                if b < a_end:
                    problems.append(f"GPU {gpu} of {node} held by jobs {a} and {other} at once")
        return problems
