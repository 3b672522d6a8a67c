"""``corral demo``: a local cluster, a showcase workload through the real commands, then stop.

Two simulated nodes with four GPUs each: a 2-node training job takes all eight GPUs, short
evaluation jobs queue behind it (reason ``Resources``/``Priority``) and run when it ends, one
broken job fails with exit code 3. ``squeue`` is shown while they run and ``sacct`` at the end.
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

TRAIN = """\
#!/bin/bash
#SBATCH --job-name=train-llm
#SBATCH --nodes=2
#SBATCH --gres=gpu:4
#SBATCH --time=5:00
#SBATCH --output=train-%j.out
echo "job $SLURM_JOB_ID on $SLURM_JOB_NODELIST ($SLURM_NNODES nodes), GPUs here: $CUDA_VISIBLE_DEVICES"
echo "MASTER_ADDR would be $(echo $SLURM_JOB_NODELIST | sed 's/\\[\\([0-9]*\\).*/\\1/')"
for step in 1 2 3; do echo "step $step/3"; sleep 2; done
"""

EVAL = """\
#!/bin/bash
#SBATCH --gres=gpu:1
#SBATCH --time=1:00
echo "eval $SLURM_JOB_NAME on $SLURMD_NODENAME GPU $CUDA_VISIBLE_DEVICES"
sleep 2
"""

BROKEN = """\
#!/bin/bash
#SBATCH --job-name=broken
echo "this one fails" >&2
exit 3
"""


def _command(name: str) -> str:
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else name


def _run(argv: list[str], env: dict[str, str], cwd: Path, stdin: str | None = None) -> str:
    print(f"$ {' '.join(argv)}", flush=True)
    out = subprocess.run(
        [_command(argv[0]), *argv[1:]],
        env=env,
        cwd=cwd,
        input=stdin,
        text=True,
        capture_output=True,
        check=False,
    )
    text = out.stdout + out.stderr
    print(textwrap.indent(text.rstrip("\n"), "  ") if text.strip() else "", flush=True)
    return out.stdout


def run_demo(state_dir: Path | None) -> int:
    """Run the showcase; returns the exit status."""
    from corral.cli.local_cluster import LocalCluster, ensure_resolvable

    temporary = state_dir is None
    state = state_dir or Path(tempfile.mkdtemp(prefix="corral-demo-"))
    cluster = LocalCluster(state, getpass.getuser(), nodes=2, gpus_per_node=4)
    config = cluster.prepare()
    warning = ensure_resolvable([n.name for n in config.nodes])
    if warning:
        print(f"corral: warning: {warning}", file=sys.stderr)
    print(
        f"Starting a local cluster (2 nodes x 4 GPUs, NATS JetStream + PostgreSQL) in {state} ...", flush=True
    )
    try:
        cluster.start()
        work = state / "demo-jobs"
        work.mkdir(exist_ok=True)
        (work / "train.sh").write_text(TRAIN)
        (work / "eval.sh").write_text(EVAL)
        env = {**os.environ, "CORRAL_STATE_DIR": str(state)}
        env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
        # the commands' server (cmdserver) lives in the demo's directory and stops with the demo
        (state / "runtime").mkdir(mode=0o700, exist_ok=True)
        env["XDG_RUNTIME_DIR"] = str(state / "runtime")
        _run(["sinfo"], env, work)
        train = _run(["sbatch", "--parsable", "train.sh"], env, work).strip()
        for i in range(4):
            _run(["sbatch", f"--job-name=eval-{i}", "eval.sh"], env, work)
        _run(["sbatch"], env, work, stdin=BROKEN)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(2)
            queue = _run(["squeue"], env, work)
            if len(queue.strip().splitlines()) <= 1:
                break
        time.sleep(1)
        _run(["sacct", "-o", "JobID,JobName%12,Partition,State,ExitCode,NodeList,Elapsed"], env, work)
        output = work / f"train-{train}.out"
        if output.exists():
            print(f"$ cat {output.name}")
            print(textwrap.indent(output.read_text().rstrip("\n"), "  "))
        print("Demo finished; stopping the cluster.", flush=True)
        return 0
    except (RuntimeError, TimeoutError) as exc:
        print(f"corral: error: {exc}", file=sys.stderr)
        return 1
    finally:
        from corral.cli import cmdclient

        cmdclient.stop_servers(cmdclient.runtime_dir({"XDG_RUNTIME_DIR": str(state / "runtime")}))
        cluster.stop()
        if temporary:
            shutil.rmtree(state, ignore_errors=True)
