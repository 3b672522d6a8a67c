"""The four moments of ``corral demo`` (``demo.py`` plays them): each submits real jobs with the real
commands (``demo_shell.py``), waits for what it shows to happen, and ends with the commands that show
it."""

from __future__ import annotations

import importlib.util
import re
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from corral.cli import demo_jobs
from corral.cli.demo_shell import WIDTH, Demo, DemoError, say, wait_until
from corral.services.agent.stop_all import crash_runs

#: The node moment 4 kills: the batch node of the run (rank 0, MASTER_ADDR, the checkpoint writer).
VICTIM = "node1"
#: The step moment 4 waits for before killing it (the run has saved checkpoints up to it).
KILL_AT_STEP = 3


def _sacct_row(demo: Demo, job: int, fields: str) -> dict[str, str]:
    """The job's ``sacct -X -P`` row, by field."""
    out = demo.shell.quiet("sacct", "-j", str(job), "-X", "-P", "-n", "-o", fields).stdout.strip()
    return dict(zip(fields.split(","), out.split("|"), strict=False))


def training(demo: Demo) -> None:
    """Moment 1: one sbatch script, 2 nodes x 2 ranks; its ranks, nodes, GPU indices and MASTER_ADDR."""
    say(
        "One sbatch script asks for 2 nodes and 4 GPUs on each; srun starts 4 ranks with 2 GPUs each. "
        "Each rank prints what torch.distributed would use: its rank, its node, its own GPU indices and "
        "the MASTER_ADDR it rendezvous at."
    )
    (demo.work / "train.sh").write_text(demo_jobs.TRAIN)
    (demo.work / "rank.sh").write_text(demo_jobs.RANK)
    demo.shell.run("cat", "train.sh")
    job = demo.shell.submit("train.sh")
    demo.shell.wait_state(job, ("RUNNING",))
    time.sleep(1)  # the ranks have started
    demo.shell.run("squeue")
    demo.shell.wait_state(job, ("COMPLETED",), timeout=60)
    demo.shell.run("cat", f"train-{job}.out")
    say("The GPUs each node gave the job, and how long it ran:")
    demo.shell.run("sacct", "-j", str(job), "-o", "JobID%8,NodeList%10,AllocTRES%34,Elapsed,State")


def interactive(demo: Demo) -> None:
    """Moment 2: ``srun --gres=gpu:N -l`` from the researcher's shell, a small distributed job."""
    # gloo rendezvous at the first node's name: it must resolve here (ensure_resolvable)
    torch = importlib.util.find_spec("torch") is not None
    if torch and demo.resolvable:
        (demo.work / "allreduce.py").write_text(demo_jobs.ALLREDUCE)
        command = ["python", "allreduce.py"]
        say(
            "A researcher tries a distributed step from their shell: srun allocates 2 GPUs on each of 2 "
            "nodes, runs one rank per node and returns. The ranks do a real torch.distributed gloo "
            "all-reduce (1 + 2 = 3); -l labels each line with its task."
        )
    else:
        (demo.work / "hello.sh").write_text(demo_jobs.HELLO)
        command = ["bash", "hello.sh"]
        why = "the node names do not resolve here" if torch else "torch is not installed"
        say(
            "A researcher tries a distributed step from their shell: srun allocates 2 GPUs on each of 2 "
            f"nodes, runs 2 tasks and returns (a plain step: {why}); -l labels each line with its task."
        )
    out = demo.shell.run("srun", "-N2", "-n2", "--gres=gpu:2", "-l", *command)
    if not re.search(r"^0: .*^1: |^1: .*^0: ", out, re.S | re.M):
        raise DemoError(f"srun's output is not labelled per task: {out!r}")
    job = _newest_job(demo)
    say("srun made a job of its own, with its step (.0):")
    demo.shell.run("sacct", "-j", str(job), "-o", "JobID%8,JobName%8,NTasks,AllocTRES%34,State")


def _newest_job(demo: Demo) -> int:
    """The id of the newest job sacct knows."""
    rows = demo.shell.quiet("sacct", "-X", "-P", "-n", "-o", "JobID").stdout.split()
    return max(int(r) for r in rows if r.isdigit())


def backfill(demo: Demo) -> None:
    """Moment 3: a large run waits for its reserved start, a short eval job backfills and ends before it."""
    say(
        "A fine-tune holds node1's 4 GPUs for 12 s (time limit 15 s). A large run needs all 8 GPUs: the "
        "scheduler reserves them for it from the fine-tune's end, and squeue --start shows when."
    )
    shell = demo.shell
    busy = shell.submit("-J", "finetune", "-N1", "--gres=gpu:4", "-t", "0:15", "--wrap", "sleep 12")
    shell.wait_state(busy, ("RUNNING",))
    big = shell.submit("-J", "train-big", "-N2", "--gres=gpu:4", "-t", "1:00", "--wrap", "sleep 2")

    def planned() -> str:
        out = shell.quiet("squeue", "--start", "-h", "-j", str(big), "-o", "%S").stdout.strip()
        return out if out not in ("", "N/A") else ""

    wait_until(lambda: bool(planned()), 20, f"job {big}'s planned start")
    shell.run("squeue", "--start", "-o", "%.5i %.9j %.2t %.19S %.5D %R")
    start = planned()
    say(
        "node2 stays idle until then. A 5-second evaluation job fits in that gap: it starts at once on "
        "node2 and ends before the large run's start, which it does not delay."
    )
    short = shell.submit("-J", "eval", "-N1", "--gres=gpu:4", "-t", "0:05", "--wrap", "sleep 3")
    shell.wait_state(short, ("RUNNING", "COMPLETED"))
    shell.run("squeue")
    shell.wait_state(big, ("COMPLETED",), timeout=60)
    shell.run(
        "sacct", "-X", "-j", f"{busy},{big},{short}", "-o", "JobID%8,JobName%9,NodeList%9,Start,End"
    )  # fmt: skip
    ran = _sacct_row(demo, big, "Start,End")
    ended = _sacct_row(demo, short, "Start,End")
    verdict = "on time" if ran["Start"] <= start else "late"
    say(
        f"eval ended {ended['End'][11:]}, before train-big's planned start {start[11:]}; train-big "
        f"started {ran['Start'][11:]}: {verdict}."
    )


def node_failure(demo: Demo) -> None:
    """Moment 4: a node of a running 2-node job dies; the job is requeued and resumes from a checkpoint."""
    shell, cluster = demo.shell, demo.cluster
    say(
        "A 2-node run checkpoints every step. When it has saved a few, the demo pulls the plug on "
        f"{VICTIM}: it kills {VICTIM}'s agent and every process of the job there."
    )
    (demo.work / "ckpt.sh").write_text(demo_jobs.CHECKPOINTED)
    (demo.work / "steps.sh").write_text(demo_jobs.STEPS)
    job = shell.submit("ckpt.sh")
    checkpoint, output = demo.work / f"checkpoint-{job}.txt", demo.work / f"ckpt-{job}.out"
    # Killed once the step is saved and its line is in the output (srun writes it from node1).
    wait_until(
        lambda: _step(checkpoint) >= KILL_AT_STEP and f"step {KILL_AT_STEP}/" in _text(output),
        60,
        f"job {job}'s step {KILL_AT_STEP}",
    )
    cluster.kill(f"agent-{VICTIM}")
    killed = crash_runs(cluster.state_dir / "agents" / VICTIM)
    crashed_at = time.monotonic()
    say(f"{VICTIM} is gone at step {_step(checkpoint)} ({killed} job processes killed with its agent).")
    wait_until(lambda: _node_state(demo, VICTIM).startswith("down"), 30, f"{VICTIM} to be down")
    say(f"{time.monotonic() - crashed_at:.1f} s later its heartbeats are missed: {VICTIM} is down.")
    shell.run("sinfo")
    wait_until(lambda: shell.state(job) in ("PENDING", "REQUEUED"), 30, f"job {job} to be requeued")
    say("The whole run was ended on both nodes (gang) and the job is back in the queue:")
    shell.run("squeue", "-j", str(job))
    _metrics(demo)
    say(f"{VICTIM} is repaired: its agent starts again, and the job runs again from its checkpoint.")
    cluster.revive(f"agent-{VICTIM}")
    shell.wait_state(job, ("COMPLETED",), timeout=60)
    shell.run("cat", f"ckpt-{job}.out")
    say("Both attempts, their nodes and GPUs:")
    shell.run("sacct", "-D", "-j", str(job), "-o", "JobID%8,State,NodeList%10,AllocTRES%34,Elapsed")
    say("Who and what caused each step of the job's life:")
    shell.run("corral", "audit", str(job))
    say("Its trace: both attempts, the node failure marked on the first:")
    shell.run("corral", "trace", str(job))


def _text(path: Path) -> str:
    """A file's text ("" if it is not there yet)."""
    try:
        return path.read_text()
    except OSError:
        return ""


def _step(checkpoint: Path) -> int:
    """The step saved in a checkpoint file (0 without one)."""
    try:
        return int(checkpoint.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def _node_state(demo: Demo, node: str) -> str:
    """sinfo's state of one node (``down*``, ``idle``, ...)."""
    out = demo.shell.quiet("sinfo", "-N", "-h", "-n", node, "-o", "%t").stdout.split()
    return out[0] if out else ""


def _metrics(demo: Demo) -> None:
    """The scheduler's GPU gauges while a node is down, as ``curl URL | grep`` would show them."""
    url = demo.cluster.metrics_urls.get("scheduler")
    if url is None:
        return
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    lines = [line for line in text.splitlines() if line.startswith("corral_gpus{") and "down" in line]
    demo.shell.show(f"$ curl -s {url} | grep 'corral_gpus{{.*down'", "\n".join(lines))


def closing(demo: Demo, total: float) -> None:
    """The end: what each moment took, and where to go from here."""
    print("\n" + "=" * WIDTH)
    times = ", ".join(f"{what} {seconds:.1f}s" for what, seconds in demo.timings)
    say(f"Demo finished in {total:.1f} s ({times}); stopping the cluster.")
    say(
        "Keep a cluster running with 'corral up' (state in ~/.corral, every process's metrics URL in "
        "~/.corral/metrics.json), then use sbatch, srun, squeue, sinfo, sacct, scontrol, corral audit and "
        "corral trace as above."
    )


#: (number, title, play) of each moment, in order.
MOMENTS: tuple[tuple[int, str, Callable[[Demo], None]], ...] = (
    (1, "A multi-node training run: one sbatch script, 2 nodes, 8 GPUs", training),
    (2, "An interactive srun --gres=gpu:N: a small distributed job", interactive),
    (3, "Backfill: a short eval job slips in before a large run's start", backfill),
    (4, "A node dies mid-run: requeued, resumed from its checkpoint", node_failure),
)
