"""An agent's start with a long-lived node's run records (``services/agent/records.py``): reading
``runs.jsonl`` (``Records(path)``, what every agent start does first) before and after the start's compaction.

The file is synthetic: ``--lines`` lines, four a run (launch decided, supervisor started, start reported,
exit reported), as a node that ran ``lines / 4`` jobs writes them; all but the last ``--recent`` runs ended
past the retention, and ``--running`` more are still running. Measured in one process: the read of the whole
file (before), the compaction, the read of the compacted file (after), each with the records held and the
memory they take (``tracemalloc``, in a read of its own: it slows the read it traces).

    python bench/agent_records.py --lines 1000000
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
import tracemalloc
from pathlib import Path

import msgspec

from corral.libs.runtime.clock import FakeClock
from corral.services.agent.records import RETENTION_S, Record, Records


def write_file(path: Path, lines: int, recent: int, running: int, now: float) -> None:
    """``lines`` lines of ended runs (the last ``recent`` runs inside the retention), then ``running``."""
    runs = lines // 4
    encode = msgspec.json.encode
    with path.open("wb") as fh:
        for i in range(runs):
            job = 1000 + i
            exited_at = now - 60.0 if i >= runs - recent else now - RETENTION_S - 3600.0
            base = Record(job_id=job, attempt=0, started_at=exited_at - 30.0, start_reported=False)
            started = msgspec.structs.replace(base, pid=10_000 + i, supervisor=20_000 + i, supervisor_start=7)
            reported = msgspec.structs.replace(started, start_reported=True)
            ended = msgspec.structs.replace(reported, exited=True, exited_at=exited_at)
            fh.write(b"".join(encode(r) + b"\n" for r in (base, started, reported, ended)))
        for i in range(running):
            fh.write(encode(Record(job_id=10**9 + i, attempt=0, pid=1, supervisor=2)) + b"\n")


def timed_read(path: Path, clock: FakeClock) -> tuple[float, Records, float]:
    """Seconds to read the file, the records, and the MiB they hold (a second, traced read)."""
    gc.collect()
    started = time.perf_counter()
    records = Records(path, clock=clock)
    seconds = time.perf_counter() - started
    tracemalloc.start()
    traced = Records(path, clock=clock)
    held = tracemalloc.get_traced_memory()[0] / 2**20
    tracemalloc.stop()
    del traced
    return seconds, records, held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--recent", type=int, default=1000, help="runs ended inside the retention")
    parser.add_argument("--running", type=int, default=10, help="runs still running")
    args = parser.parse_args()
    clock = FakeClock(now=time.time())
    with tempfile.TemporaryDirectory(prefix="corral-bench-records-") as tmp:
        path = Path(tmp) / "runs.jsonl"
        write_file(path, args.lines, args.recent, args.running, clock.now())
        size = os.path.getsize(path)
        lines = args.lines // 4 * 4 + args.running
        read_s, records, mem = timed_read(path, clock)
        held = len(records.runs)
        started = time.perf_counter()
        forgotten = records.compact()
        compact_s = time.perf_counter() - started
        del records
        after_s, after, after_mem = timed_read(path, clock)
        print(f"load {os.getloadavg()[0]:.1f}")
        print("| step | lines | file MiB | records held | seconds | records' memory MiB |")
        print("|---|---|---|---|---|---|")
        mib = size / 2**20
        print(f"| read before compaction | {lines} | {mib:.1f} | {held} | {read_s:.3f} | {mem:.1f} |")
        print(f"| compaction (forgot {forgotten}) | {lines} | | {held - forgotten} | {compact_s:.3f} | |")
        print(
            f"| read after compaction | {len(path.read_bytes().splitlines())} | "
            f"{os.path.getsize(path) / 2**20:.2f} | {len(after.runs)} | {after_s:.4f} | {after_mem:.1f} |"
        )


if __name__ == "__main__":
    main()
