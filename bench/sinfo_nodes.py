"""Benchmark: sinfo's ``nodes`` verb on a cluster of thousands of nodes, in the scheduler's process.

Usage: ``python bench/sinfo_nodes.py [--nodes 10000 20000] [--before DIR]``.

Builds the configuration and the state of a cluster of N nodes x 8 GPUs in three partitions
(``cluster_workload.py``, as ``backfill_pass.py``), then times what one ``sinfo`` costs the scheduler: every
page of ``views.nodes_reply`` and its JSON encoding (each scheduler answers each sinfo and
``scontrol show node``, on its event loop). Prints the pages, their bytes and the seconds. With ``--before
DIR`` the same runs in a process that imports Corral from the checkout in DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def measure(n: int) -> dict[str, float]:
    """One sinfo's every page on a cluster of ``n`` nodes: pages, bytes, seconds."""
    import msgspec
    from cluster_workload import build_log, config_text

    from corral.libs.config.cluster import parse_config
    from corral.libs.core.fold import fold
    from corral.schemas import api
    from corral.services.scheduler import views

    config = parse_config(config_text(n))
    entries, _ = build_log(n, 10)
    state = fold(entries)
    started = time.perf_counter()
    request, pages, size = api.NodesRequest(), 0, 0
    while True:
        reply = views.nodes_reply(state, config, request, time.time())
        size += len(msgspec.json.encode(reply))
        pages += 1
        if not getattr(reply, "more", False):
            break
        request = msgspec.structs.replace(request, after_node=reply.nodes[-1].name)
    return {"pages": pages, "bytes": size, "seconds": time.perf_counter() - started}


def main() -> int:
    """Time this checkout (and DIR's), print a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10_000, 20_000])
    parser.add_argument("--before", type=Path, help="a checkout of the code before")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child)))
        return 0
    print("| nodes | code | pages | bytes | seconds |")
    print("|---|---|---|---|---|")
    for n in args.nodes:
        for name, root in (("before", args.before), ("after", HERE.parent)):
            if root is None:
                continue
            env = {**os.environ, "PYTHONPATH": f"{root.resolve() / 'src'}:{HERE}"}
            command = [sys.executable, __file__, "--child", str(n)]
            done = subprocess.run(command, env=env, check=True, capture_output=True, text=True, cwd="/")
            got = json.loads(done.stdout)
            print(
                f"| {n:,} | {name} | {got['pages']} | {got['bytes']:,} | {got['seconds']:.3f} |", flush=True
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
