"""sbatch's options and #SBATCH directives: every form, precedence, quoting, and each refusal's exact line."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TypeVar

import msgspec
import pytest

from corral.cli.client import CallTimeout, Cluster, find_cluster
from corral.cli.errors import CliError, error_line, run_command
from corral.cli.options import Option as Opt
from corral.cli.options import OptionTable, flag, unsupported
from corral.cli.sbatch import read_script
from corral.cli.sbatch import submit as submit_job
from corral.cli.sbatch_args import Submission, build_submission, parse_command_line
from corral.cli.sbatch_env import MAX_ENVIRONMENT_BYTES
from corral.cli.sbatch_script import MAX_SCRIPT_BYTES, NOT_A_SCRIPT, directive_lines
from corral.libs.runtime.credentials import Credentials
from corral.libs.slurm.errors import FormatError
from corral.libs.slurm.timefmt import parse_begin_time
from corral.schemas.api import SubmitRequest
from corral.schemas.events import ArrayRange, ArraySpec, Constraint, Dependencies, Dependency

pytestmark = pytest.mark.unit

R = TypeVar("R")

SCRIPT = b"#!/bin/bash\necho hello\n"
ENV = {"HOME": "/home/alice", "PATH": "/usr/bin", "SLURM_JOB_ID": "7", "SBATCH_PARTITION": "x", "FOO": "bar"}


def submit(argv: list[str], script: bytes = SCRIPT, env: dict[str, str] | None = None) -> Submission:
    """Run sbatch's parsing as the command does, with the script bytes given directly."""
    invocation = parse_command_line(argv)
    data = None if invocation.wrap is not None else script
    return build_submission(
        invocation, data, environ=ENV if env is None else env, cwd="/home/alice/run", hostname="login1"
    )


def sbatch_error(argv: list[str], script: bytes = SCRIPT, env: dict[str, str] | None = None) -> str:
    """The stderr line sbatch prints for a refused submission."""
    with pytest.raises((CliError, FormatError)) as info:
        submit(argv, script, env)
    exc = info.value
    return error_line("sbatch", exc.message if isinstance(exc, CliError) else str(exc))


def with_directives(*lines: str) -> bytes:
    return ("#!/bin/bash\n" + "".join(line + "\n" for line in lines) + "srun hostname\n").encode()


# (argv, script, JobSpec field, expected value)
OPTION_CASES: list[tuple[list[str], bytes, str, Any]] = [
    (["-J", "train", "s.sh"], SCRIPT, "name", "train"),
    (["-Jtrain", "s.sh"], SCRIPT, "name", "train"),
    (["--job-name=train", "s.sh"], SCRIPT, "name", "train"),
    (["--job-name", "train", "s.sh"], SCRIPT, "name", "train"),
    (["--job-n=train", "s.sh"], SCRIPT, "name", "train"),
    (["/home/alice/jobs/train.sh"], SCRIPT, "name", "train.sh"),
    ([], SCRIPT, "name", "sbatch"),
    (["--wrap", "echo hi"], SCRIPT, "name", "wrap"),
    (
        ["--wrap=echo hi"],
        SCRIPT,
        "script",
        "#!/bin/sh\n# This script was created by sbatch --wrap.\n\necho hi\n",
    ),
    (["s.sh", "--lr", "0.1", "-J", "x"], SCRIPT, "argv", ("--lr", "0.1", "-J", "x")),
    (["s.sh", "--lr", "0.1", "-J", "x"], SCRIPT, "name", "s.sh"),
    (["-o", "logs/%j.out", "s.sh"], SCRIPT, "stdout", "logs/%j.out"),
    (["--output=o.txt", "-e", "e.txt", "s.sh"], SCRIPT, "stderr", "e.txt"),
    (["s.sh"], SCRIPT, "stdout", None),
    (["-N", "4", "s.sh"], SCRIPT, "nodes", 4),
    (["-N4", "s.sh"], SCRIPT, "nodes", 4),
    (["--nodes=4", "s.sh"], SCRIPT, "ntasks", 4),
    (["-n", "8", "-N", "2", "s.sh"], SCRIPT, "ntasks", 8),
    (["-N", "2", "--ntasks-per-node=4", "s.sh"], SCRIPT, "ntasks", 8),
    (["-N", "2", "--ntasks-per-node", "4", "s.sh"], SCRIPT, "ntasks_per_node", 4),
    (["-c", "6", "s.sh"], SCRIPT, "cpus_per_task", 6),
    (["--cpus-per-task=6", "s.sh"], SCRIPT, "cpus_per_task", 6),
    (["-t", "30", "s.sh"], SCRIPT, "time_limit_s", 1800),
    (["-t", "1:30", "s.sh"], SCRIPT, "time_limit_s", 90),
    (["--time=2:00:00", "s.sh"], SCRIPT, "time_limit_s", 7200),
    (["--time", "1-0", "s.sh"], SCRIPT, "time_limit_s", 86400),
    (["-t1-00:30", "s.sh"], SCRIPT, "time_limit_s", 88200),
    (["-t", "1-0:0:5", "s.sh"], SCRIPT, "time_limit_s", 86405),
    (["s.sh"], SCRIPT, "time_limit_s", None),
    (["-p", "gpu", "s.sh"], SCRIPT, "partition", "gpu"),
    (["--partition=gpu", "s.sh"], SCRIPT, "partition", "gpu"),
    (["-A", "proj", "s.sh"], SCRIPT, "account", "proj"),
    (["--account=proj", "s.sh"], SCRIPT, "account", "proj"),
    (["--gres=gpu:4", "s.sh"], SCRIPT, "gpus_per_node", 4),
    (["--gres=gpu:h100:4", "s.sh"], SCRIPT, "gpu_type", "h100"),
    (["--gres", "gpu", "s.sh"], SCRIPT, "gpus_per_node", 1),
    (["--gres=none", "s.sh"], SCRIPT, "gpus_per_node", 0),
    (["--gpus-per-node=8", "s.sh"], SCRIPT, "gpus_per_node", 8),
    (["--gpus-per-node=a100:2", "s.sh"], SCRIPT, "gpu_type", "a100"),
    (["-w", "gpu[01-03]", "s.sh"], SCRIPT, "nodelist", ("gpu01", "gpu02", "gpu03")),
    (["-w", "gpu[01-03]", "s.sh"], SCRIPT, "nodes", 3),
    (["--nodelist=gpu01,gpu01", "-N", "4", "s.sh"], SCRIPT, "nodelist", ("gpu01",)),
    (["--nodelist=gpu01", "-N", "4", "s.sh"], SCRIPT, "nodes", 4),
    (["s.sh"], SCRIPT, "nodelist", ()),
    (["-x", "gpu[02,04]", "s.sh"], SCRIPT, "exclude", ("gpu02", "gpu04")),
    (["--exclude=gpu01", "s.sh"], SCRIPT, "nodes", 1),
    (["-C", "nvlink", "s.sh"], SCRIPT, "constraint", Constraint(features=["nvlink"])),
    (["--constraint=a&b", "s.sh"], SCRIPT, "constraint", Constraint(features=["a", "b"])),
    (["--constraint", "a|b", "s.sh"], SCRIPT, "constraint", Constraint(features=["a", "b"], any_of=True)),
    (
        ["s.sh"],
        with_directives("#SBATCH -C 'ib&nvlink'"),
        "constraint",
        Constraint(features=["ib", "nvlink"]),
    ),
    (["s.sh"], SCRIPT, "constraint", None),
    (["--exclusive", "s.sh"], SCRIPT, "exclusive", True),
    (["s.sh"], with_directives("#SBATCH --exclusive"), "exclusive", True),
    (["s.sh"], SCRIPT, "exclusive", False),
    (["--gpus-per-task=2", "-n", "8", "-N", "2", "s.sh"], SCRIPT, "gpus_per_node", 8),
    (["--gpus-per-task=2", "-n", "8", "-N", "2", "s.sh"], SCRIPT, "gpus_per_task", 2),
    (["--gpus-per-task=h100:1", "--ntasks-per-node=4", "s.sh"], SCRIPT, "gpus_per_node", 4),
    (["--gpus-per-task=h100:1", "--ntasks-per-node=4", "s.sh"], SCRIPT, "gpu_type", "h100"),
    (["--gpus-per-task=1", "-n", "3", "-N", "2", "s.sh"], SCRIPT, "gpus_per_node", 2),
    (["-G", "8", "-N", "2", "s.sh"], SCRIPT, "gpus_per_node", 4),
    (["--gpus=a100:4", "s.sh"], SCRIPT, "gpus_per_node", 4),
    (["--gpus=a100:4", "s.sh"], SCRIPT, "gpu_type", "a100"),
    (["-G", "8", "-N", "2", "s.sh"], SCRIPT, "gpus_per_task", None),
    (["--gpus-per-node=4", "--cpus-per-gpu=6", "s.sh"], SCRIPT, "cpus_per_gpu", 6),
    (["--gpus-per-node=4", "s.sh"], SCRIPT, "cpus_per_gpu", None),
    (["--gpus-per-node=4", "--mem-per-gpu=10G", "s.sh"], SCRIPT, "mem_per_node_mb", 40 * 1024),
    (["-G", "4", "-N", "2", "--mem-per-gpu=100M", "s.sh"], SCRIPT, "mem_per_node_mb", 200),
    # --mem-per-cpu: times the CPUs of the busiest node (tasks per node x cpus per task, or per GPU)
    (["--mem-per-cpu=2G", "-n", "4", "-N", "2", "s.sh"], SCRIPT, "mem_per_node_mb", 4096),
    (["--mem-per-cpu=1000M", "-n", "3", "-N", "2", "-c", "2", "s.sh"], SCRIPT, "mem_per_node_mb", 4000),
    (["--mem-per-cpu=1G", "--gres=gpu:2", "--cpus-per-gpu=4", "s.sh"], SCRIPT, "mem_per_node_mb", 8192),
    (["--mem=8G", "s.sh"], SCRIPT, "mem_per_node_mb", 8192),
    (["--mem", "3584MB", "s.sh"], SCRIPT, "mem_per_node_mb", 3584),
    (["--mem=15GB", "s.sh"], SCRIPT, "mem_per_node_mb", 15360),
    (["--mem=0", "s.sh"], SCRIPT, "mem_per_node_mb", 0),
    (["--open-mode=append", "s.sh"], SCRIPT, "open_mode", "append"),
    (["--open-mode", "truncate", "s.sh"], SCRIPT, "open_mode", "truncate"),
    (["s.sh"], SCRIPT, "requeue", True),
    (["--no-requeue", "s.sh"], SCRIPT, "requeue", False),
    (["--no-requeue", "--requeue", "s.sh"], SCRIPT, "requeue", True),
    (["-D", "sub/../out", "s.sh"], SCRIPT, "workdir", "/home/alice/run/out"),
    (["--chdir=/scratch", "s.sh"], SCRIPT, "workdir", "/scratch"),
    (["s.sh"], SCRIPT, "workdir", "/home/alice/run"),
    (["s.sh"], SCRIPT, "submit_host", "login1"),
    (["s.sh"], SCRIPT, "environment", {"HOME": "/home/alice", "PATH": "/usr/bin", "FOO": "bar"}),
    (
        ["--export=ALL", "s.sh"],
        SCRIPT,
        "environment",
        {"HOME": "/home/alice", "PATH": "/usr/bin", "FOO": "bar"},
    ),
    (["--export=NONE", "s.sh"], SCRIPT, "environment", {}),
    (["--export=NONE,FOO,NOPE", "s.sh"], SCRIPT, "environment", {"FOO": "bar"}),
    (["--export=FOO,X=1", "s.sh"], SCRIPT, "environment", {"FOO": "bar", "X": "1"}),
    (
        ["--export=ALL,FOO=baz,SLURM_CPU_BIND=none", "s.sh"],
        SCRIPT,
        "environment",
        {"HOME": "/home/alice", "PATH": "/usr/bin", "FOO": "baz", "SLURM_CPU_BIND": "none"},
    ),
    # #SBATCH directives: every form, padding, quoting and comments.
    (["s.sh"], with_directives("#SBATCH -J from-script"), "name", "from-script"),
    (["s.sh"], with_directives("#SBATCH --job-name from-script"), "name", "from-script"),
    (["s.sh"], with_directives("#SBATCH    --time    10:00   "), "time_limit_s", 600),
    (["s.sh"], with_directives('#SBATCH --job-name="my job"'), "name", "my job"),
    (["s.sh"], with_directives("#SBATCH -J 'a b' # a comment"), "name", "a b"),
    (["s.sh"], with_directives("#SBATCH --job-name=a#b"), "name", "a#b"),
    (["s.sh"], with_directives("#SBATCH -N2 -c 4"), "cpus_per_task", 4),
    (["s.sh"], with_directives("#SBATCH -e %x-%J.err"), "stderr", "%x-%J.err"),
    (["s.sh"], with_directives("", "# setup", "#SBATCH -J late", ""), "name", "late"),
    (["s.sh"], with_directives("##SBATCH -J off"), "name", "s.sh"),
    (["s.sh"], with_directives("  #SBATCH -J indented"), "name", "s.sh"),
    (["s.sh"], with_directives("echo start", "#SBATCH -J too-late"), "name", "s.sh"),
    (["s.sh"], with_directives("#SBATCH --export=NONE"), "environment", {}),
    # Command-line options override directives, whatever their form.
    (["-J", "cli", "s.sh"], with_directives("#SBATCH -J script"), "name", "cli"),
    (["--time=5", "s.sh"], with_directives("#SBATCH -t 10"), "time_limit_s", 300),
    (["--requeue", "s.sh"], with_directives("#SBATCH --no-requeue"), "requeue", True),
    (
        ["-p", "cli", "s.sh"],
        with_directives("#SBATCH --partition=a", "#SBATCH --partition=b"),
        "partition",
        "cli",
    ),
    (["s.sh"], with_directives("#SBATCH --partition=a", "#SBATCH --partition=b"), "partition", "b"),
    # Dependencies, hold and begin time.
    (["s.sh"], SCRIPT, "dependencies", None),
    (
        ["-d", "afterok:5", "s.sh"],
        SCRIPT,
        "dependencies",
        Dependencies(items=[Dependency(type="afterok", job_id=5)]),
    ),
    (
        ["--dependency=afterok:5:6,afternotok:7", "s.sh"],
        SCRIPT,
        "dependencies",
        Dependencies(
            items=[
                Dependency(type="afterok", job_id=5),
                Dependency(type="afterok", job_id=6),
                Dependency(type="afternotok", job_id=7),
            ]
        ),
    ),
    (
        ["--dependency", "after:5?afterany:6", "s.sh"],
        SCRIPT,
        "dependencies",
        Dependencies(
            items=[Dependency(type="after", job_id=5), Dependency(type="afterany", job_id=6)], any_of=True
        ),
    ),
    (
        ["s.sh"],
        with_directives("#SBATCH -d singleton"),
        "dependencies",
        Dependencies(items=[Dependency(type="singleton")]),
    ),
    (["--dependency=", "s.sh"], with_directives("#SBATCH -d singleton"), "dependencies", None),
    (["s.sh"], SCRIPT, "held", False),
    (["-H", "s.sh"], SCRIPT, "held", True),
    (["--hold", "s.sh"], SCRIPT, "held", True),
    (["s.sh"], with_directives("#SBATCH --hold"), "held", True),
    (["s.sh"], SCRIPT, "begin_time", None),
    (
        ["--begin=2030-01-02T03:04:05", "s.sh"],
        SCRIPT,
        "begin_time",
        datetime(2030, 1, 2, 3, 4, 5).timestamp(),
    ),
    (["-b", "2030-01-02", "s.sh"], SCRIPT, "begin_time", datetime(2030, 1, 2).timestamp()),
    # Job arrays: every form, -a and #SBATCH, the command line winning.
    (["s.sh"], SCRIPT, "array", None),
    (
        ["--array=0-999%32", "s.sh"],
        SCRIPT,
        "array",
        ArraySpec(ranges=[ArrayRange(start=0, end=999)], throttle=32),
    ),
    (["--array=1-7:2", "s.sh"], SCRIPT, "array", ArraySpec(ranges=[ArrayRange(start=1, end=7, step=2)])),
    (
        ["--array", "1,3,5-9", "s.sh"],
        SCRIPT,
        "array",
        ArraySpec(
            ranges=[ArrayRange(start=1, end=1), ArrayRange(start=3, end=3), ArrayRange(start=5, end=9)]
        ),
    ),
    (["-a", "4", "s.sh"], SCRIPT, "array", ArraySpec(ranges=[ArrayRange(start=4, end=4)])),
    (["--qos=high", "s.sh"], SCRIPT, "qos", "high"),
    (["-q", "high", "s.sh"], SCRIPT, "qos", "high"),
    (["s.sh"], with_directives("#SBATCH -q long"), "qos", "long"),
    (["s.sh"], SCRIPT, "qos", None),
    (["s.sh"], SCRIPT, "nice", 0),
    (["--nice", "s.sh"], SCRIPT, "nice", 100),
    (["--nice=7", "s.sh"], SCRIPT, "nice", 7),
    (["--nice=-20", "s.sh"], SCRIPT, "nice", -20),
    (["s.sh"], with_directives("#SBATCH --nice"), "nice", 100),
    (["-a0-1000", "s.sh"], SCRIPT, "array", ArraySpec(ranges=[ArrayRange(start=0, end=1000)])),
    (
        ["s.sh"],
        with_directives("#SBATCH --array=0-5%2"),
        "array",
        ArraySpec(ranges=[ArrayRange(start=0, end=5)], throttle=2),
    ),
    (["s.sh"], with_directives("#SBATCH -a 2-3"), "array", ArraySpec(ranges=[ArrayRange(start=2, end=3)])),
    (
        ["-a", "7", "s.sh"],
        with_directives("#SBATCH -a 2-3"),
        "array",
        ArraySpec(ranges=[ArrayRange(start=7, end=7)]),
    ),
]


@pytest.mark.parametrize(
    ("argv", "script", "attribute", "expected"),
    OPTION_CASES,
    ids=[" ".join(c[0]) or "stdin" for c in OPTION_CASES],
)
def test_option_sets_spec_field(argv: list[str], script: bytes, attribute: str, expected: Any) -> None:
    assert getattr(submit(argv, script).spec, attribute) == expected


#: 2023-11-14 22:13:20 UTC, a Tuesday: the ``now`` of the begin-time cases.
NOW = 1_700_000_000.0
BEGIN_CASES = [
    ("now", NOW),
    ("now+60", NOW + 60),
    ("now+90s", NOW + 90),
    ("now+1hour", NOW + 3600),
    ("NOW+2hours", NOW + 7200),
    ("now+30minutes", NOW + 1800),
    ("now+1day", NOW + 86400),
    ("now+2weeks", NOW + 14 * 86400),
    ("23:00", NOW + 2800),  # later today
    ("22:00", NOW + 86400 - 800),  # passed today: tomorrow
    ("23:00:30", NOW + 2830),
    ("11:00pm", NOW + 2800),
    ("midnight", NOW + 6400),
    ("noon", NOW + 6400 + 12 * 3600),
    ("teatime", NOW + 6400 + 16 * 3600),
    ("today", NOW - 80000),
    ("tomorrow", NOW + 6400),
    ("2023-11-20", NOW + 6400 + 5 * 86400),
    ("2023-11-20T10:30", NOW + 6400 + 5 * 86400 + 37800),
]


@pytest.mark.parametrize(("text", "expected"), BEGIN_CASES, ids=[c[0] for c in BEGIN_CASES])
def test_begin_time_forms(text: str, expected: float) -> None:
    assert parse_begin_time(text, NOW, tz=UTC) == expected


def test_begin_is_relative_to_the_submission_time() -> None:
    invocation = parse_command_line(["--begin=now+3", "s.sh"])
    submission = build_submission(invocation, SCRIPT, environ={}, cwd="/", hostname="h", now=NOW)
    assert submission.spec.begin_time == NOW + 3


@pytest.mark.parametrize(
    ("argv", "command"),
    [(["s.sh"], "/home/alice/run/s.sh"), (["../bin/./s.sh"], "/home/alice/bin/s.sh"),
     (["/opt/j.sh"], "/opt/j.sh"), (["--wrap=hostname"], None), ([], None)],
    ids=["relative", "normalised", "absolute", "wrap", "stdin"],
)  # fmt: skip
def test_command_is_the_scripts_absolute_path(argv: list[str], command: str | None) -> None:
    """scontrol's Command= is the script's absolute path, (null) from stdin or --wrap, as in Slurm."""
    assert submit(argv).spec.command == command


def test_script_is_copied_verbatim() -> None:
    script = with_directives("#SBATCH -J x")
    assert submit(["s.sh"], script).spec.script == script.decode()


@pytest.mark.parametrize(
    ("argv", "script", "parsable"),
    [
        (["s.sh"], SCRIPT, False),
        (["--parsable", "s.sh"], SCRIPT, True),
        (["s.sh"], with_directives("#SBATCH --parsable"), True),
    ],
    ids=["default", "command line", "directive"],
)
def test_parsable(argv: list[str], script: bytes, parsable: bool) -> None:
    assert submit(argv, script).parsable is parsable


def test_fewer_tasks_than_nodes_shrinks_nodes_with_a_warning() -> None:
    submission = submit(["-N", "4", "-n", "2", "s.sh"])
    assert (submission.spec.nodes, submission.spec.ntasks) == (2, 2)
    assert submission.warnings == ("can't run 2 processes on 4 nodes, setting nnodes to 2",)


def test_directive_lines_stop_at_first_command() -> None:
    script = "#!/bin/sh\n#SBATCH -J a\n\n# note\n#SBATCH -N 2\npython x.py\n#SBATCH -J b\n"
    assert directive_lines(script) == [(2, " -J a"), (5, " -N 2")]


ERROR_CASES: list[tuple[list[str], bytes, str]] = [
    (["--foo", "s.sh"], SCRIPT, "sbatch: error: unrecognized option '--foo'"),
    (["-z", "s.sh"], SCRIPT, "sbatch: error: invalid option -- 'z'"),
    (["--qos=", "s.sh"], SCRIPT, "sbatch: error: Invalid qos specification: --qos needs a QOS name"),
    (
        ["--nice=lots", "s.sh"],
        SCRIPT,
        'sbatch: error: Invalid nice value "lots": use a whole number between -2147483645 and 2147483645',
    ),
    (
        ["--nice=2147483646", "s.sh"],
        SCRIPT,
        'sbatch: error: Invalid nice value "2147483646": use a whole number between -2147483645 and '
        "2147483645",
    ),
    (
        ["--mem-per-cpu=1G", "--mem=2G", "s.sh"],
        SCRIPT,
        "sbatch: error: --mem, --mem-per-cpu, and --mem-per-gpu are mutually exclusive",
    ),
    (
        ["--mem-per-cpu=lots", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --mem-per-cpu "lots": use a whole number with an optional unit K, M, G, T '
        "or P (e.g. 500M, 8G, 8GB, 3584MB)",
    ),
    (
        ["--array=0-1001", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --array "0-1001": array index 1001 is too large: indices go from 0 to 1000 '
        "(MaxArraySize=1001)",
    ),
    (
        ["--array=5-1", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --array "5-1": a range N-M needs 0 <= N <= M',
    ),
    (
        ["-a", "1-7:0", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --array "1-7:0": a range\'s :STEP must be at least 1',
    ),
    (
        ["--array=0-15%0", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --array "0-15%0": '
        "the %MAX_RUNNING limit must be a whole number of at least 1",
    ),
    (
        ["--array=a-b", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --array "a-b": use indices N, ranges N-M or N-M:STEP joined by commas, '
        "optionally %MAX_RUNNING (e.g. 0-15%4, 1-7:2, 1,3,5-9)",
    ),
    (
        ["s.sh"],
        with_directives("#SBATCH --array=-1"),
        'sbatch: error: invalid --array "-1": use indices N, ranges N-M or N-M:STEP joined by commas, '
        "optionally %MAX_RUNNING (e.g. 0-15%4, 1-7:2, 1,3,5-9)",
    ),
    (
        ["--kill-on-invalid-dep=yes", "s.sh"],
        SCRIPT,
        "sbatch: error: option --kill-on-invalid-dep is not supported by Corral yet",
    ),
    (
        ["-d", "afterok:5,afterany:6?afterok:7", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --dependency "afterok:5,afterany:6?afterok:7": '
        "use either , (all of) or ? (any of) between items, not both",
    ),
    (
        ["-d", "after:5+10", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --dependency "after:5+10": '
        "a +TIME delay after a dependency is not supported by Corral yet",
    ),
    (
        ["-d", "aftercorr:5", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --dependency "aftercorr:5": '
        "aftercorr dependencies are not supported by Corral yet",
    ),
    (
        ["-d", "afterok:5_2", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --dependency "afterok:5_2": '
        "a dependency on one array task (A_T) is not supported by Corral yet: name the task's own job id, "
        "or the array's id A for all its tasks",
    ),
    (
        ["-d", "afterok", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --dependency "afterok": use TYPE:JOBID[:JOBID...] items joined by , '
        "(all of) or ? (any of), TYPE one of after, afterok, afternotok, afterany; or singleton",
    ),
    (
        ["-d", "afterok:0", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --dependency "afterok:0": use TYPE:JOBID[:JOBID...] items joined by , '
        "(all of) or ? (any of), TYPE one of after, afterok, afternotok, afterany; or singleton",
    ),
    (
        ["-d", "singleton:5", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --dependency "singleton:5": singleton takes no job id',
    ),
    (
        ["--begin=soon", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --begin "soon": use now[+COUNT[seconds|minutes|hours|days|weeks]], '
        "HH:MM[:SS], YYYY-MM-DD[THH:MM[:SS]], today, tomorrow, midnight, noon, elevenses, fika or teatime",
    ),
    (["--hold=yes", "s.sh"], SCRIPT, "sbatch: error: option '--hold' doesn't allow an argument"),
    (["-J"], SCRIPT, "sbatch: error: option requires an argument -- 'J'"),
    (["--job-name"], SCRIPT, "sbatch: error: option '--job-name' requires an argument"),
    (["--parsable=yes", "s.sh"], SCRIPT, "sbatch: error: option '--parsable' doesn't allow an argument"),
    (
        ["--no", "s.sh"],
        SCRIPT,
        "sbatch: error: option '--no' is ambiguous; possibilities: '--no-kill' "
        "'--no-requeue' '--nodefile' '--nodelist' '--nodes'",
    ),
    (
        ["--gpus-per-node=2", "--gres=gpu:2", "s.sh"],
        SCRIPT,
        "sbatch: error: --gpus-per-node and --gres=gpu are mutually exclusive",
    ),
    (
        ["--gpus-per-node=2", "s.sh"],
        with_directives("#SBATCH --gres=gpu:4"),
        "sbatch: error: --gpus-per-node and --gres=gpu are mutually exclusive",
    ),
    (
        ["--gpus-per-task=1", "--gpus-per-node=2", "s.sh"],
        SCRIPT,
        "sbatch: error: --gpus-per-node and --gpus-per-task are mutually exclusive",
    ),
    (
        ["-G", "2", "--gres=gpu:2", "s.sh"],
        SCRIPT,
        "sbatch: error: --gres=gpu and --gpus are mutually exclusive",
    ),
    (
        ["-G", "3", "-N", "2", "s.sh"],
        SCRIPT,
        "sbatch: error: --gpus=3: 3 GPUs cannot be spread evenly over 2 nodes: ask for a multiple of 2, "
        "or use --gpus-per-node",
    ),
    (
        ["--cpus-per-gpu=4", "-c", "2", "-G", "1", "s.sh"],
        SCRIPT,
        "sbatch: error: --cpus-per-gpu and --cpus-per-task are mutually exclusive",
    ),
    (
        ["--cpus-per-gpu=4", "s.sh"],
        SCRIPT,
        "sbatch: error: --cpus-per-gpu needs GPUs: "
        "add --gpus, --gpus-per-node, --gpus-per-task or --gres=gpu",
    ),
    (
        ["--mem-per-gpu=1G", "--mem=4G", "-G", "1", "s.sh"],
        SCRIPT,
        "sbatch: error: --mem, --mem-per-cpu, and --mem-per-gpu are mutually exclusive",
    ),
    (
        ["--mem-per-gpu=1G", "s.sh"],
        SCRIPT,
        "sbatch: error: --mem-per-gpu needs GPUs: add --gpus, --gpus-per-node, --gpus-per-task or --gres=gpu",
    ),
    (
        ["-w", "/etc/hosts", "s.sh"],
        SCRIPT,
        "sbatch: error: --nodelist=/etc/hosts: reading node names from a file is not supported by Corral yet",
    ),
    (
        ["-C", "[a|b]", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --constraint "[a|b]": brackets, counts and parentheses are not supported by '
        "Corral yet; use FEATURE, FEATURE&FEATURE... (all of them) or FEATURE|FEATURE... (any of them)",
    ),
    (
        ["-C", "a*2", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --constraint "a*2": brackets, counts and parentheses are not supported by '
        "Corral yet; use FEATURE, FEATURE&FEATURE... (all of them) or FEATURE|FEATURE... (any of them)",
    ),
    (
        ["-C", "a&b|c", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --constraint "a&b|c": mixing & and | is not supported by Corral yet; '
        "use FEATURE, FEATURE&FEATURE... (all of them) or FEATURE|FEATURE... (any of them)",
    ),
    (
        ["-C", "a&&b", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --constraint "a&&b": '
        "use FEATURE, FEATURE&FEATURE... (all of them) or FEATURE|FEATURE... (any of them)",
    ),
    (["--exclusive=user", "s.sh"], SCRIPT, "sbatch: error: option '--exclusive' doesn't allow an argument"),
    (["s.sh"], b"echo hello\n", f"sbatch: error: {NOT_A_SCRIPT}"),
    (["s.sh"], b"", "sbatch: error: Batch script is empty!"),
    (["s.sh"], b" \n\n", "sbatch: error: Batch script contains only whitespace!"),
    (
        ["s.sh"],
        b"#!/bin/sh\r\necho\r\n",
        "sbatch: error: Batch script contains DOS line breaks (\\r\\n) "
        "instead of expected UNIX line breaks (\\n).",
    ),
    (["s.sh"], b"#!/bin/sh\n\xff\n", "sbatch: error: batch script is not UTF-8 text (byte 10)"),
    (
        ["-t", "abc", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --time "abc": use M, M:S, H:M:S, D-H, D-H:M or D-H:M:S',
    ),
    (
        ["--gres=gpu:-1", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --gres "gpu:-1": '
        "use NAME[:TYPE][:COUNT][,...] (e.g. gpu, gpu:2, gpu:h100:4, gpu:2,nic:1)",
    ),
    (
        ["--gres=nic:1", "s.sh"],
        SCRIPT,
        "sbatch: error: --gres=nic:1: only gpu GRES are supported by Corral yet",
    ),
    (
        ["--mem=abc", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --mem "abc": use a whole number with an optional '
        "unit K, M, G, T or P (e.g. 500M, 8G, 8GB, 3584MB)",
    ),
    (["-N", "0", "s.sh"], SCRIPT, 'sbatch: error: invalid --nodes "0": use a whole number of at least 1'),
    (
        ["-N", "2-4", "s.sh"],
        SCRIPT,
        "sbatch: error: --nodes=2-4: node count ranges are not supported by Corral yet",
    ),
    (["-n", "x", "s.sh"], SCRIPT, 'sbatch: error: invalid --ntasks "x": use a whole number of at least 1'),
    (
        ["-c", "0", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --cpus-per-task "0": use a whole number of at least 1',
    ),
    (
        ["--open-mode=sometimes", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --open-mode "sometimes": use append or truncate',
    ),
    (
        ["-p", "a,b", "s.sh"],
        SCRIPT,
        "sbatch: error: --partition=a,b: a list of partitions is not supported by Corral yet",
    ),
    (
        ["--export=ALL,1X=2", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --export "ALL,1X=2": "1X" is not a variable name',
    ),
    (["--wrap=hostname", "s.sh"], SCRIPT, "sbatch: error: Script arguments not permitted with --wrap option"),
    (
        ["s.sh"],
        with_directives("#SBATCH --foo"),
        "sbatch: error: unrecognized option '--foo' (#SBATCH line 2)",
    ),
    (
        ["s.sh"],
        with_directives("#SBATCH -F hosts.txt"),
        "sbatch: error: option --nodefile is not supported by Corral yet (#SBATCH line 2)",
    ),
    (
        ["s.sh"],
        with_directives("#SBATCH -J my job"),
        "sbatch: error: unexpected argument 'job' in #SBATCH line 2",
    ),
    (
        ["s.sh"],
        with_directives("#SBATCH -J 'open"),
        "sbatch: error: cannot read #SBATCH line 2: No closing quotation",
    ),
    (
        ["--signal=FOO@10", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --signal "FOO@10": use [{R|B}:]SIG[@SECONDS] '
        "(e.g. USR1, SIGUSR1@90, B:TERM@120, 10@30)",
    ),
    (
        ["--signal=USR1@x", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --signal "USR1@x": give @SECONDS as a whole number from 0 to 65535',
    ),
    (
        ["s.sh"],
        with_directives("#SBATCH --signal=Q:USR1"),
        'sbatch: error: invalid --signal "Q:USR1": use [{R|B}:]SIG[@SECONDS] '
        "(e.g. USR1, SIGUSR1@90, B:TERM@120, 10@30)",
    ),
    (["-D", "", "s.sh"], SCRIPT, 'sbatch: error: invalid --chdir "": give a directory'),
    (["-o", "", "s.sh"], SCRIPT, 'sbatch: error: invalid --output "": give a file name pattern'),
    (["--error=", "s.sh"], SCRIPT, 'sbatch: error: invalid --error "": give a file name pattern'),
    (
        ["--export=", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --export "": use ALL, NONE or [ALL,]NAME[=value],...',
    ),
    (["--test-only=1", "s.sh"], SCRIPT, "sbatch: error: option '--test-only' doesn't allow an argument"),
    (["--parsable=3", "s.sh"], SCRIPT, "sbatch: error: option '--parsable' doesn't allow an argument"),
    (["--requeue=yes", "s.sh"], SCRIPT, "sbatch: error: option '--requeue' doesn't allow an argument"),
    (["-J"], SCRIPT, "sbatch: error: option requires an argument -- 'J'"),
    (["--wrap"], SCRIPT, "sbatch: error: option '--wrap' requires an argument"),
    (
        ["--dependency=afterok:x", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --dependency "afterok:x": use TYPE:JOBID[:JOBID...] items joined by , '
        "(all of) or ? (any of), TYPE one of after, afterok, afternotok, afterany; or singleton",
    ),
    (
        ["-w", "n[1-", "s.sh"],
        SCRIPT,
        'sbatch: error: invalid --nodelist "n[1-": brackets may not nest and must be balanced',
    ),
]


@pytest.mark.parametrize(("argv", "script", "line"), ERROR_CASES, ids=[c[2][15:60] for c in ERROR_CASES])
def test_refusal_line(argv: list[str], script: bytes, line: str) -> None:
    assert sbatch_error(argv, script) == line


def test_script_over_the_limit_is_refused() -> None:
    script = b"#!/bin/sh\n" + b"#" * MAX_SCRIPT_BYTES
    assert sbatch_error(["s.sh"], script) == (
        f"sbatch: error: batch script is {len(script)} bytes, more than the limit of {MAX_SCRIPT_BYTES}"
    )


def test_environment_over_the_limit_is_refused() -> None:
    line = sbatch_error(["s.sh"], env={"BIG": "x" * MAX_ENVIRONMENT_BYTES})
    assert line.startswith("sbatch: error: the environment to export is 1048581 bytes, more than the limit")


def test_environment_that_is_not_text_is_dropped_with_a_warning() -> None:
    submission = submit(["s.sh"], env={"OK": "1", "BAD": "\udcff"})
    assert submission.spec.environment == {"OK": "1"}
    assert submission.warnings == ("not exporting BAD: its value is not valid UTF-8",)


def test_missing_script_file() -> None:
    with pytest.raises(CliError) as info:
        read_script("/nonexistent/job.sh")
    assert info.value.message == "Unable to open file /nonexistent/job.sh"


def test_sbatch_main_prints_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    from corral.cli.sbatch import main

    assert main(["--bogus"]) == 255  # Slurm's getopt lines and exit status (test_slurm_refusals)
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == (
        "",
        "sbatch: unrecognized option '--bogus'\nTry \"sbatch --help\" for more information\n",
    )


def test_unexpected_exception_is_one_line_without_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    def broken(argv: list[str]) -> int:
        raise RuntimeError("boom")

    assert run_command("squeue", broken, []) == 1
    assert (
        capsys.readouterr().err == "squeue: error: internal error (RuntimeError: boom); please report this\n"
    )


# The option parser itself (getopt_long's rules), on a small table.
TABLE = OptionTable(
    [
        Opt("jobs", "j"),
        flag("noheader", "h"),
        Opt("name", "n", aliases=("jobname",)),
        *unsupported("clusters/M"),
    ]
)


@pytest.mark.parametrize(
    ("argv", "values", "positionals"),
    [
        (["-hj5"], [("noheader", ""), ("jobs", "5")], []),
        (["12", "-j", "5", "13"], [("jobs", "5")], ["12", "13"]),
        (["--jobname=x"], [("name", "x")], []),
        (["--", "-j"], [], ["-j"]),
        (["-j", "-5"], [("jobs", "-5")], []),
    ],
    ids=["bundled flags", "positionals between options", "alias", "double dash", "dash value"],
)
def test_option_parser(argv: list[str], values: list[tuple[str, str]], positionals: list[str]) -> None:
    parsed = TABLE.parse(argv)
    assert (parsed.values, parsed.positionals) == (values, positionals)


def test_repeated_comma_lists_accumulate() -> None:
    assert TABLE.parse(["-j", "5", "-j", "6,7", "--jobs=8,"]).items("jobs") == ["5", "6", "7", "8"]


def test_unsupported_short_option_names_the_long_one() -> None:
    with pytest.raises(CliError, match="option --clusters is not supported by Corral yet"):
        TABLE.parse(["-M", "other"])


class FlakyCluster(Cluster, frozen=True):
    """A cluster whose first submit times out; it records every request."""

    requests: list[msgspec.Struct] = msgspec.field(default_factory=list)  # every request, in order

    def call(self, verb: str, request: msgspec.Struct, reply_type: type[R]) -> R:
        self.requests.append(request)
        if len(self.requests) == 1:
            raise CallTimeout("no reply on corral.api.v1.submit.alice within 15 s")
        return reply_type(job_id=7)  # type: ignore[call-arg]


def test_submit_retries_a_timeout_once_with_the_same_token() -> None:
    cluster = FlakyCluster(url="nats://x:4222", credentials=Credentials(url="", user="alice", password="pw"))
    assert submit_job(cluster, submit(["s.sh"]).spec) == 7
    tokens = [request.token for request in cluster.requests if isinstance(request, SubmitRequest)]
    assert len(tokens) == 2 and tokens[0] == tokens[1] and len(tokens[0]) == 32


def test_no_cluster_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("LOGNAME", "alice")
    with pytest.raises(CliError) as info:
        find_cluster({"CORRAL_STATE_DIR": "/nonexistent/state"})
    assert info.value.message == (
        "no Corral cluster found (no /nonexistent/state/credentials/alice.json, no corral authd at "
        "/run/corral/authd.sock): start one with 'corral up', or set CORRAL_AUTH_SOCKET, or CORRAL_NATS_URL "
        "and CORRAL_CREDENTIALS"
    )
