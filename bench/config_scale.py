"""Benchmark: what thousands of nodes and accounts cost the commands, the scheduler and the gateway.

Usage: ``python bench/config_scale.py [--nodes 10000 20000] [--accounts 2000] [--before DIR]``.

Nodes: builds the configuration and the state of a cluster of N nodes x 8 GPUs in three partitions
(``cluster_workload.py``, as ``backfill_pass.py``), then times what one ``sinfo`` costs the scheduler: every
page of ``views.nodes_reply`` and its JSON encoding (each scheduler answers each sinfo and ``scontrol show
node``, on its event loop), its pages and bytes; and what the gateway's ``validate_spec`` costs for a job of
a shape it has not seen yet (whether it could ever fit its partition's idle nodes; kept per shape after),
the median of three shapes.

Accounts: a configuration of N accounts of 20 users each; the time to parse it, and the account lookups of
one submission (``default_account``, ``may_use``, ``accounts_of``, ``account``) for a user of the last
account, after one to warm up. Then the fair-share factors a scheduling cycle computes with a fair-share
weight (``priority.fairshare_factors``, Fair Tree and classic), every association charged, one user with
pending jobs in every fourth account: the mean of 5 cycles after one; and one ``sshare`` of a user's own
rows (the scheduler's ``shares`` verb, ``priority_views.shares_reply``), the mean of 3 after one.

With ``--before DIR`` each runs in a process that imports Corral from the checkout in DIR too.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def measure(n: int) -> dict[str, float]:
    """One sinfo's every page on a cluster of ``n`` nodes: pages, bytes, seconds."""
    import msgspec
    from cluster_workload import build_log, config_text

    from corral.libs.config.cluster import parse_config
    from corral.libs.core.fold import fold
    from corral.schemas import api
    from corral.schemas import events as ev
    from corral.services.gateway.validate import validate_spec
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
    seconds = time.perf_counter() - started
    checks = []
    for gpus in (1, 2, 3):
        spec = ev.JobSpec(
            name="b", script="#!/bin/sh\n", workdir="/tmp", gpus_per_node=gpus, nodes=1, ntasks=1
        )
        started = time.perf_counter()
        validate_spec(spec, config)
        checks.append(time.perf_counter() - started)
    return {"pages": pages, "bytes": size, "seconds": seconds, "shape": sorted(checks)[1]}


def accounts(n: int) -> dict[str, float]:
    """Parse a configuration of ``n`` accounts; one submission's account lookups, in ms."""
    from corral.libs.config.cluster import parse_config

    tables = ['[[nodes]]\nnames = "n[1-4]"\ncpus = 8\nmemory = "16G"\n']
    for a in range(n):
        users = ", ".join(f'"u{a}_{k}"' for k in range(20))
        tables.append(f'[[accounts]]\nname = "acct{a}"\nparent = "root"\nusers = [{users}]\n')
    started = time.perf_counter()
    config = parse_config("\n".join(tables))
    parsed = time.perf_counter() - started
    user, account = f"u{n - 1}_19", f"acct{n - 1}"
    config.default_account(user), config.account(account)
    started = time.perf_counter()
    for _ in range(100):
        config.default_account(user), config.may_use(user, account), config.accounts_of(user)
        config.account(account)
    out = {"parse": parsed, "lookups_ms": (time.perf_counter() - started) * 10}
    out.update(fair_share(config, n))
    return out


def fair_share(config: Any, n: int) -> dict[str, float]:
    """Milliseconds of a cycle's fair-share factors under ``config``'s accounts, each algorithm."""
    import dataclasses
    import inspect

    from corral.libs.config.policy import policy_of
    from corral.libs.core.fair_share import charge, user_key
    from corral.libs.core.priority import PriorityWeights, fairshare_factors
    from corral.libs.core.state import State

    state = State()
    policy = dataclasses.replace(policy_of(config), weights=PriorityWeights(fairshare=10_000))
    for i, assoc in enumerate(policy.associations):
        charge(state.usage, user_key(assoc.user, assoc.account), float(1 + i % 97), 1e9 - i, 7 * 86400.0)
    users = {f"u{a}_0" for a in range(0, n, 4)}
    wanted = [{f"acct{a}/u{a}_0" for a in range(0, n, 4)}]
    if "wanted" not in inspect.signature(fairshare_factors).parameters:
        wanted = []  # (the code before: every association's factor)
    out = {}
    for algorithm in ("fair_tree", "classic"):
        chosen = dataclasses.replace(policy, fairshare=algorithm)
        fairshare_factors(state, 1e9, chosen, users, *wanted)
        started = time.perf_counter()
        for _ in range(5):
            fairshare_factors(state, 1e9, chosen, users, *wanted)
        out[algorithm] = (time.perf_counter() - started) / 5 * 1000
    from corral.schemas import api
    from corral.services.scheduler.priority_views import shares_reply

    shares_reply(state, policy, api.SharesRequest(), "u7_3", 1e9)
    started = time.perf_counter()
    for _ in range(3):
        shares_reply(state, policy, api.SharesRequest(), "u7_3", 1e9)
    out["sshare"] = (time.perf_counter() - started) / 3 * 1000
    return out


def run(root: Path, *args: str) -> dict[str, float]:
    """This script's ``--child`` run in a process that imports Corral from ``root``."""
    env = {**os.environ, "PYTHONPATH": f"{root.resolve() / 'src'}:{HERE}"}
    command = [sys.executable, __file__, *args]
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True, cwd="/")
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def main() -> int:
    """Time this checkout (and DIR's), print a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10_000, 20_000])
    parser.add_argument("--accounts", type=int, nargs="+", default=[2000])
    parser.add_argument("--before", type=Path, help="a checkout of the code before")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child-accounts", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child)))
        return 0
    if args.child_accounts:
        print(json.dumps(accounts(args.child_accounts)))
        return 0
    sides = [(name, root) for name, root in (("before", args.before), ("after", HERE.parent)) if root]
    print("| nodes | code | pages | bytes | seconds, one sinfo | seconds, a new job shape at the gateway |")
    print("|---|---|---|---|---|---|")
    for n in args.nodes:
        for name, root in sides:
            got = run(root, "--child", str(n))
            cells = f"{got['pages']} | {got['bytes']:,} | {got['seconds']:.3f} | {got['shape']:.4f}"
            print(f"| {n:,} | {name} | {cells} |", flush=True)
    print()
    print("| accounts (20 users each) | code | parse, s | one submission's account lookups, ms |", end="")
    print(" a cycle's fair share, Fair Tree, ms | classic, ms | one sshare, ms |")
    print("|---|---|---|---|---|---|---|")
    for n in args.accounts:
        for name, root in sides:
            got = run(root, "--child-accounts", str(n))
            cells = f"{got['parse']:.3f} | {got['lookups_ms']:.4f}"
            cells += f" | {got['fair_tree']:.1f} | {got['classic']:.1f} | {got['sshare']:.1f}"
            print(f"| {n:,} | {name} | {cells} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
