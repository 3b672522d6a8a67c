"""Benchmark: where a served command's time goes, stage by stage (issue 14, command start-up).

Usage: ``python bench/served_stages.py [--runs 100] [ARGV...]`` (default: ``sbatch --parsable --hold`` of a
one-line script). Starts a local cluster (1 node), then a command server of this checkout whose stages are
timed: this script's ``--serve`` mode wraps the spare's accept, the child's frames, its becoming the client's
process and its NATS request with CLOCK_MONOTONIC stamps (one clock for every process here), which each child
appends to a file as it ends. The command runs ``--runs`` times as a user runs it (a fresh process, its
output captured, ``CORRAL_CMD_SERVER=require``), and the median of each stage is printed, from the caller
starting the process to the caller seeing it end. The wrappers cost a few microseconds a stage.

``bench/latency.py`` measures the wall time without wrappers; this is for finding what is left in it.
"""

from __future__ import annotations

import argparse
import ast
import getpass
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
SCRIPT = "#!/bin/sh\ntrue\n"
#: The stages, in order: (stamp, what the time up to it from the previous stamp is).
STAGES = (
    ("accepted", "process start, imports, connect (client)"),
    ("request", "request received (child)"),
    ("started", "request decoded, checked (stale, identity)"),
    ("became", "became the client's process"),
    ("go", "waited for go"),
    ("nats_start", "the command until its request"),
    ("nats_connected", "NATS connect"),
    ("nats_reply", "the request (gateway round trip)"),
    ("exit", "the command after its reply, streams flushed"),
)


def _serve(path: str, ident_hex: str, log: str) -> int:
    """An instrumented command server (``--serve``): cmdserver's, each child's stage stamps in ``log``."""
    from corral.cli import cmdchild, cmdserver
    from corral.libs.runtime import nats_request

    stamps: dict[str, int] = {}

    def stamp(name: str) -> None:
        stamps[name] = time.monotonic_ns()

    def after(owner: Any, name: str, label: str, reset: bool = False) -> None:
        inner = getattr(owner, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            result = inner(*args, **kwargs)
            if reset:
                stamps.clear()
            stamp(label)
            return result

        setattr(owner, name, wrapped)

    after(cmdserver, "_accept", "accepted", reset=True)
    after(cmdchild, "_become", "became")
    after(nats_request.Connection, "_handshake", "nats_connected")
    # the names cmdchild took from cmdclient, and the one-request function of the commands' NATS client
    inner_recv, inner_frame = getattr(cmdchild, "recv_frame"), getattr(cmdchild, "frame")  # noqa: B009
    inner_request = nats_request.request

    def recv_frame(*args: Any) -> object:
        value = inner_recv(*args)
        stamp("go" if value == "go" else "request")
        return value

    def frame(value: object) -> bytes:
        if isinstance(value, tuple):
            stamp(str(value[0]))
        framed: bytes = inner_frame(value)
        return framed

    def request(*args: Any, **kwargs: Any) -> nats_request.Reply:
        stamp("nats_start")
        reply = inner_request(*args, **kwargs)
        stamp("nats_reply")
        return reply

    setattr(cmdchild, "recv_frame", recv_frame)  # noqa: B010
    setattr(cmdchild, "frame", frame)  # noqa: B010
    setattr(nats_request, "request", request)  # noqa: B010
    exit_now = os._exit

    def leave(status: int) -> None:
        if "accepted" in stamps:
            with open(log, "a") as out:
                out.write(repr(stamps) + "\n")
        exit_now(status)

    setattr(os, "_exit", leave)  # noqa: B010
    return cmdserver.main([path, ident_hex])


def _median_ms(earlier: list[int], later: list[int]) -> float:
    return statistics.median((b - a) / 1e6 for a, b in zip(earlier, later, strict=True))


def main() -> int:
    """Run the benchmark and print the stages."""
    if sys.argv[1:2] == ["--serve"]:
        return _serve(*sys.argv[2:5])
    from corral.cli import cmdclient
    from corral.cli.local_cluster import LocalCluster, ensure_resolvable

    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("argv", nargs="*", default=["sbatch", "--parsable", "--hold", "job.sh"])
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="corral-stages-"))
    cluster = LocalCluster(state, getpass.getuser(), nodes=1, gpus_per_node=4)
    ensure_resolvable([n.name for n in cluster.prepare().nodes])
    work = state / "work"
    work.mkdir()
    (work / "job.sh").write_text(SCRIPT)
    (state / "runtime").mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: see bench/latency.py
    env.update(
        CORRAL_STATE_DIR=str(state),
        PYTHONPYCACHEPREFIX=str(state / "pycache"),
        XDG_RUNTIME_DIR=str(state / "runtime"),
        CORRAL_CMD_SERVER="require",
    )
    command = BIN / args.argv[0]
    # the interpreter the command runs with: the identity its server must have
    python = command.read_text().splitlines()[0].removeprefix("#!").split()[0]
    where = subprocess.run(
        [python, "-c", "import os; from corral.cli import cmdclient as c; i = c.identity(os.environ); "
         "print(c.socket_path(c.private_dir(c.runtime_dir(os.environ)), i), i.encode().hex())"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    log = state / "stages.log"
    try:
        cluster.start()
        server = subprocess.Popen(
            [python, "-P", __file__, "--serve", *where, str(log)],
            env=env, cwd="/", stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not os.path.exists(where[0]):
            assert server.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        starts, ends, bare = [], [], []
        for i in range(args.runs + 3):
            started = time.monotonic_ns()
            done = subprocess.run([command, *args.argv[1:]], env=env, cwd=work, capture_output=True)
            if done.returncode != 0:
                raise RuntimeError(f"{args.argv} exited {done.returncode}: {done.stderr.decode()}")
            if i >= 3:  # the first ones load what is not loaded yet
                starts.append(started)
                ends.append(time.monotonic_ns())
            # the interpreter's own start in the same loop: the floor of the first stage
            floor = time.monotonic_ns()
            subprocess.run([python, "-c", "pass"], env=env, cwd=work, capture_output=True, check=True)
            bare.append((time.monotonic_ns() - floor) / 1e6)
        time.sleep(0.5)
        records = [ast.literal_eval(line) for line in log.read_text().splitlines()][3:]
        print(f"`{' '.join(args.argv)}` served, n={len(records)}, load average {os.getloadavg()[0]:.2f}\n")
        print("| stage | median ms |\n|---|---|")
        previous: list[int] = starts
        for name, what in STAGES:
            if name in records[0]:
                now = [r[name] for r in records]
                print(f"| {what} | {_median_ms(previous, now):.2f} |")
                previous = now
        print(f"| exit status to the caller seeing the end | {_median_ms(previous, ends):.2f} |")
        print(f"| **wall** | **{_median_ms(starts, ends):.1f}** |")
        print(f"\n`python -c pass` in the same loop: {statistics.median(bare):.1f} ms")
        return 0
    finally:
        cmdclient.stop_servers(cmdclient.runtime_dir(env))
        cluster.stop()
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
