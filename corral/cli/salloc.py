"""``salloc``: get an allocation, run a command (default: the user's shell) here with the job's
``SLURM_*`` variables, and release the allocation when it exits (with its exit code).

The command runs on the calling host, as with Slurm's default; ``srun`` inside it runs steps on the
allocated nodes. The allocation is a job whose batch script only waits (as ``srun`` outside a job makes).
"""

from __future__ import annotations

import os
import subprocess
import sys

from corral.cli.errors import CliError, run_command
from corral.cli.options import version_text
from corral.cli.srun import Allocation, SrunArgs, allocation_argv, allocation_spec, parse_args, step_launch
from corral.libs.slurm import hostlist

COMMAND = "salloc"

USAGE = """\
Usage: salloc [OPTIONS...] [COMMAND [ARGS...]]   (default command: $SHELL)

  Allocation options as sbatch's: -N -n -c --ntasks-per-node -J -p -A -t --gres --gpus-per-node -G
  --gpus-per-task --mem -w -x -C --exclusive -q --reservation -D --export
  -h, --help                  this help          -V, --version           version
"""


def job_variables(job_id: int, nodelist: str, nnodes: int, name: str) -> dict[str, str]:
    """What salloc sets for its command (srun inside it finds the job through them)."""
    return {
        "SLURM_JOB_ID": str(job_id),
        "SLURM_JOBID": str(job_id),
        "SLURM_JOB_NAME": name,
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_NODELIST": nodelist,
        "SLURM_JOB_NUM_NODES": str(nnodes),
        "SLURM_NNODES": str(nnodes),
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``salloc``."""
    return run_command(COMMAND, _salloc, argv)


def _salloc(argv: list[str]) -> int:
    args = parse_args(argv, require_command=False)
    if args.options.given("help") or args.options.given("usage"):
        sys.stdout.write(USAGE)
        return 0
    if args.options.given("version"):
        print(version_text())
        return 0
    for name in ("label", "output", "error", "unbuffered"):
        if args.options.given(name):
            raise CliError(f"option --{name} is not a salloc option (it is srun's)")
    command = args.argv or [os.environ.get("SHELL") or "/bin/sh"]
    cwd = os.getcwd()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    launch = step_launch(SrunArgs(options=args.options, argv=command), environ, cwd, inside=False)
    spec = allocation_spec(allocation_argv(args, launch), environ, cwd)
    from corral.cli.client import find_cluster

    with Allocation(find_cluster(), spec, command=COMMAND) as alloc:
        print(f"{COMMAND}: Granted job allocation {alloc.job_id}", file=sys.stderr)
        nnodes = len(hostlist.expand(alloc.nodelist))
        env = {**environ, **job_variables(alloc.job_id, alloc.nodelist, nnodes, spec.name)}
        try:
            status = subprocess.call(command, env=env)
        except OSError as exc:
            alloc.exit_code = 1
            raise CliError(f"{command[0]}: {exc.strerror}") from None
        alloc.exit_code = status if status >= 0 else 128 - status
        print(f"{COMMAND}: Relinquishing job allocation {alloc.job_id}", file=sys.stderr)
    return alloc.exit_code


if __name__ == "__main__":
    sys.exit(main())
