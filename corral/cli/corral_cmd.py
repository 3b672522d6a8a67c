"""``corral``: run a local cluster (``up``), a showcase (``demo``), the simulator (``sim``), a job's trace
(``trace``) and history (``audit``), and operator tools (``log export``, ``serviceaccount``)."""

from __future__ import annotations

import argparse
import getpass
import os
import signal
import sys
import time
from pathlib import Path

from corral.libs.config.settings import default_state_dir


def _up(args: argparse.Namespace) -> int:
    from corral.cli.local_cluster import LocalCluster, ensure_resolvable
    from corral.cli.supervision import Supervisor

    cluster = LocalCluster(
        Path(args.state_dir),
        getpass.getuser(),
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        ha=args.ha,
        auth_socket=Path(args.auth_socket) if args.auth_socket else None,
    )
    config = cluster.prepare(reconfigure=args.nodes_given)
    warning = ensure_resolvable([n.name for n in config.nodes])
    if warning:
        print(f"corral: warning: {warning}", file=sys.stderr)
    stopping = False

    def _stop(signum: int, frame: object) -> None:
        nonlocal stopping
        if stopping:
            return
        stopping = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    # Also when started in the background by a shell without job control, which leaves SIGINT ignored.
    signal.signal(signal.SIGINT, _stop)
    try:
        cluster.start()
        gpus = sum(n.gpus for n in config.nodes)
        print(
            f"corral: local cluster {config.name!r} is up: {len(config.nodes)} nodes, {gpus} GPUs; "
            f"state in {cluster.state_dir}. Ctrl-C stops it.",
            flush=True,
        )
        print(f"corral: Prometheus metrics (also in {cluster.metrics_file}):", flush=True)
        for name, url in cluster.metrics_urls.items():
            print(f"  {name:<16} {url}", flush=True)
        # A process that dies from now on is started again (corral/cli/supervision.py): no job is killed
        # because a service died.
        supervisor = Supervisor(cluster, time.monotonic())
        while True:
            time.sleep(0.5)
            for line in supervisor.tick(time.monotonic()):
                print(f"corral: {line}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("corral: stopping", file=sys.stderr, flush=True)
        return 0
    except (RuntimeError, TimeoutError) as exc:
        print(f"corral: error: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        cluster.stop()


def _demo(args: argparse.Namespace) -> int:
    from corral.cli.demo import run_demo

    only = 1 if args.fast else args.only
    return run_demo(Path(args.state_dir) if args.state_dir else None, only)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``corral`` command."""
    words = sys.argv[1:] if argv is None else argv
    if words[:1] == ["sim"]:
        # sim has its own parser (and its own --help); imported only when used.
        from corral.cli.sim import main as sim_main

        return sim_main(words[1:])
    if words[:1] == ["log"]:
        from corral.cli.log_export import main as log_main

        return log_main(words[1:])
    if words[:1] == ["trace"]:
        from corral.cli.trace_cmd import main as trace_main

        return trace_main(words[1:])

    if words[:1] == ["deploy"]:
        from corral.cli.deploy import main as deploy_main

        return deploy_main(words[1:])
    if words[:1] == ["credentials"]:
        from corral.cli.credentials_cmd import main as credentials_main

        return credentials_main(words[1:])
    if words[:1] == ["authd"]:
        from corral.cli.authd import main as authd_main

        return authd_main(words[1:])
    if words[:1] == ["audit"]:
        from corral.cli.audit import main as audit_main

        return audit_main(words[1:])
    if words[:1] == ["serviceaccount"]:
        from corral.cli.serviceaccount import main as serviceaccount_main

        return serviceaccount_main(words[1:])
    if words[:1] == ["feed"]:
        from corral.cli.feed_cmd import main as feed_main

        return feed_main(words[1:])
    parser = argparse.ArgumentParser(prog="corral", description="Corral: a workload manager for GPU clusters")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="run a local cluster in the foreground")
    up.add_argument("--state-dir", default=str(default_state_dir()), help="where the cluster keeps its state")
    up.add_argument("--nodes", type=int, default=None, help="simulated GPU nodes (default 2)")
    up.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (default 4)")
    up.add_argument(
        "--ha",
        action="store_true",
        help="three clustered NATS servers (streams at 3 replicas), two gateways, two health services, two"
        " schedulers (a leader and a standby), two accounting services (a partition of the projection each),"
        " two feed services (both publish, the feed drops the second copies)",
    )
    up.add_argument(
        "--auth-socket",
        default=os.environ.get("CORRAL_AUTH_SOCKET") or None,
        help="where corral authd gives other local users a ticket (default <state>/authd.sock; "
        "/run/corral/authd.sock lets every user of the host in with no setup)",
    )
    demo = sub.add_parser(
        "demo", help="start a local cluster, play four moments of a GPU cluster's life, stop (~1 min)"
    )
    demo.add_argument("--state-dir", default=None, help="state directory (default: a fresh temporary one)")
    chosen = demo.add_mutually_exclusive_group()
    chosen.add_argument(
        "--only",
        type=int,
        choices=range(1, 5),
        metavar="N",
        help="play moment N only: 1 multi-node training, 2 interactive srun, 3 backfill, 4 node failure",
    )
    chosen.add_argument("--fast", action="store_true", help="play the first moment only (--only 1)")
    sub.add_parser("sim", help="replay a workload trace or an event log in virtual time (corral sim -h)")
    sub.add_parser("log", help="export the event log for a what-if replay (corral log export -h)")
    sub.add_parser("trace", help="show a job's span tree, derived from the log (corral trace -h)")
    sub.add_parser("audit", help="a job's history: who did what and why (corral audit -h)")
    sub.add_parser("feed", help="your job event feed as JSON lines (corral feed -h)")
    sub.add_parser("deploy", help="write a deployment for several machines (corral deploy init -h)")
    sub.add_parser("serviceaccount", help="add, list or remove service accounts (corral serviceaccount -h)")
    sub.add_parser("credentials", help="revoke, restore, rotate credentials (corral credentials -h)")
    sub.add_parser("authd", help="issue tickets to local users, as munged (corral authd -h)")
    args = parser.parse_args(argv)
    if args.command == "up":
        args.nodes_given = args.nodes is not None or args.gpus_per_node is not None
        args.nodes = args.nodes or 2
        args.gpus_per_node = args.gpus_per_node if args.gpus_per_node is not None else 4
        if args.nodes < 1 or args.nodes > 64 or args.gpus_per_node < 0 or args.gpus_per_node > 16:
            parser.error("--nodes must be 1-64 and --gpus-per-node 0-16 for a local cluster")
        return _up(args)
    return _demo(args)


if __name__ == "__main__":
    raise SystemExit(main())
