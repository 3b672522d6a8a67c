"""Topology input: sbatch --switches/--segment, [[blocks]] and max_switch_wait in config, submit checks."""

from __future__ import annotations

from datetime import UTC

import msgspec
import pytest
from builders import T0, Log, cluster, job, submitted

from corral.cli.errors import CliError, error_line
from corral.cli.sbatch_args import build_submission, parse_command_line
from corral.cli.scontrol_show_job import show_job
from corral.libs.config.cluster import BlockConfig, ClusterConfig, ConfigError, parse_config
from corral.libs.core.plan import Plan
from corral.libs.runtime.errors import InvalidInput
from corral.libs.slurm.errors import FormatError
from corral.schemas.events import JobSpec
from corral.services.gateway.validate import validate_spec
from corral.services.scheduler.views import job_info, policy_of

pytestmark = pytest.mark.unit

SCRIPT = b"#!/bin/bash\nsrun hostname\n"


def spec_of(argv: list[str], script: bytes = SCRIPT) -> JobSpec:
    invocation = parse_command_line(argv)
    return build_submission(invocation, script, environ={}, cwd="/home/alice", hostname="login1").spec


def sbatch_error(argv: list[str]) -> str:
    with pytest.raises((CliError, FormatError)) as info:
        spec_of(argv)
    exc = info.value
    return error_line("sbatch", exc.message if isinstance(exc, CliError) else str(exc))


OPTIONS = [
    (["s.sh"], (None, None, None)),
    (["--switches=2", "-N", "4", "s.sh"], (2, None, None)),
    (["--switches=1@10:00", "-N", "4", "s.sh"], (1, 600, None)),
    (["--switches", "1@1-00:00:00", "s.sh"], (1, 86400, None)),
    (["--switches=1@0", "s.sh"], (1, 0, None)),
    (["--switches=1@UNLIMITED", "s.sh"], (1, None, None)),
    (["--segment=2", "-N", "4", "s.sh"], (None, None, 2)),
    (["-N", "8", "--segment=4", "--switches=2@5", "s.sh"], (2, 300, 4)),
]


@pytest.mark.parametrize(("argv", "expected"), OPTIONS, ids=[" ".join(c[0]) for c in OPTIONS])
def test_switches_and_segment_are_parsed(argv: list[str], expected: tuple[object, ...]) -> None:
    spec = spec_of(argv)
    assert (spec.switches, spec.switches_wait_s, spec.segment) == expected


def test_directives_set_them_and_the_command_line_wins() -> None:
    script = b"#!/bin/bash\n#SBATCH -N 4\n#SBATCH --switches=1@5:00\n#SBATCH --segment=2\nsrun hostname\n"
    assert (spec_of(["s.sh"], script).switches, spec_of(["s.sh"], script).segment) == (1, 2)
    assert spec_of(["--switches=3", "--segment=4", "s.sh"], script).switches == 3


ERRORS = [
    (["--switches=0", "s.sh"], 'sbatch: error: invalid --switches "0": use a whole number of at least 1'),
    (["--switches=x", "s.sh"], 'sbatch: error: invalid --switches "x": use a whole number of at least 1'),
    (
        ["--switches=1@", "s.sh"],
        'sbatch: error: invalid --switches "1@": give a wait after @, e.g. --switches=1@10:00',
    ),
    (["--segment=0", "s.sh"], 'sbatch: error: invalid --segment "0": use a whole number of at least 1'),
    (
        ["-N", "4", "--segment=3", "s.sh"],
        "sbatch: error: --segment=3: the job's 4 nodes are not a multiple of the segment size; "
        "ask for a multiple of 3 nodes (-N) or a segment size that divides 4",
    ),
]


@pytest.mark.parametrize(("argv", "line"), ERRORS, ids=[c[1][15:55] for c in ERRORS])
def test_bad_values_are_refused_naming_the_option(argv: list[str], line: str) -> None:
    assert sbatch_error(argv) == line


def test_a_bad_switch_wait_names_the_option() -> None:
    assert "--switches" in sbatch_error(["--switches=1@soon", "s.sh"])


# --- configuration --------------------------------------------------------------------------------------

BASE = """
[[nodes]]
names = "gpu[01-10]"
cpus = 64
memory = "500G"
gpus = 8

[[partitions]]
name = "gpu"
default = true
"""


def config(extra: str) -> ClusterConfig:
    return parse_config(BASE + extra)


def test_blocks_are_read_and_a_node_in_no_block_is_its_own() -> None:
    cfg = config(
        '[[blocks]]\nname = "nvl1"\nnodes = "gpu[01-04]"\n\n[[blocks]]\nname = "nvl2"\nnodes = "gpu[05-08]"\n'
    )
    assert cfg.blocks == (
        BlockConfig("nvl1", ("gpu01", "gpu02", "gpu03", "gpu04")),
        BlockConfig("nvl2", ("gpu05", "gpu06", "gpu07", "gpu08")),
    )
    blocks = policy_of(cfg).blocks
    assert blocks["gpu01"] == "nvl1" and blocks["gpu08"] == "nvl2" and "gpu09" not in blocks
    assert config("").blocks == () and policy_of(config("")).blocks == {}


@pytest.mark.parametrize(
    ("text", "wait"),
    [("", 300), ("max_switch_wait = 60", 60), ('max_switch_wait = "10:00"', 600), ("max_switch_wait = 0", 0)],
    ids=["Slurm's default", "seconds", "duration", "zero"],
)
def test_max_switch_wait(text: str, wait: int) -> None:
    cfg = config(f"[scheduler]\n{text}\n")
    assert cfg.scheduler.max_switch_wait_s == wait and policy_of(cfg).max_switch_wait_s == wait


BAD_CONFIG = [
    (
        '[[blocks]]\nname = "b"\nnodes = "gpu[09-11]"\n',
        "blocks[0].nodes: gpu11 is not in any [[nodes]] table",
    ),
    (
        '[[blocks]]\nname = "a"\nnodes = "gpu[01-02]"\n[[blocks]]\nname = "b"\nnodes = "gpu[02-03]"\n',
        "blocks[1].nodes: gpu02 is already in block 'a'; a node belongs to one block",
    ),
    (
        '[[blocks]]\nname = "a"\nnodes = "gpu01"\n[[blocks]]\nname = "a"\nnodes = "gpu02"\n',
        "blocks[1].name: block 'a' is defined twice; give each block its own name",
    ),
    ('[[blocks]]\nname = "a"\n', "blocks[0]: missing key 'nodes'"),
    ('[[blocks]]\nnodes = "gpu01"\n', "blocks[0]: missing key 'name'"),
    ('[[blocks]]\nname = "a"\nnodes = "gpu01"\nswitch = 1\n', "blocks[0]: unknown key 'switch'; known keys:"),
    ('[[blocks]]\nname = "a b"\nnodes = "gpu01"\n', "blocks[0].name: 'a b' is not a valid block name"),
    ('[blocks]\nname = "a"\n', "blocks: expected a list of [[blocks]] tables"),
    ("[scheduler]\nmax_switch_wait = -1\n", "scheduler.max_switch_wait: must be >= 0 seconds, got -1"),
    ('[scheduler]\nmax_switch_wait = "UNLIMITED"\n', "scheduler.max_switch_wait: must be a duration"),
]


@pytest.mark.parametrize(("text", "message"), BAD_CONFIG, ids=[c[1][:45] for c in BAD_CONFIG])
def test_bad_topology_config_is_refused(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config(text)
    assert str(info.value).startswith(message)


# --- submit validation ----------------------------------------------------------------------------------

#: Blocks of 4, 4 and 2 nodes.
CLUSTER = config(
    '[[blocks]]\nname = "a"\nnodes = "gpu[01-04]"\n[[blocks]]\nname = "b"\nnodes = "gpu[05-08]"\n'
    '[[blocks]]\nname = "c"\nnodes = "gpu[09-10]"\n'
)


@pytest.mark.parametrize(
    "spec",
    [
        job(gpus=8, nodes=8, switches=1),  # more than a block: runs on several once the wait is over
        job(gpus=8, nodes=8, segment=4),
        job(gpus=8, nodes=10, segment=2),
        job(gpus=8, nodes=2, segment=2, nodelist=["gpu09"]),
    ],
    ids=["switches=1 wider than a block", "segment=4", "segment=2 everywhere", "segment with -w"],
)
def test_topology_that_can_be_met_is_accepted(spec: JobSpec) -> None:
    validate_spec(spec, CLUSTER)


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        (job(gpus=8, nodes=4, segment=8), "segment", "the job's 4 nodes are not a multiple of the segment"),
        (job(gpus=8, nodes=10, segment=5), "segment", "the blocks of partition gpu hold 0 such segments"),
        (job(gpus=8, nodes=8, segment=4, exclude=["gpu01"]), "segment", "hold 1 such segments"),
        (job(gpus=8, nodes=2, segment=2), "segment", None),  # fine here; refused without blocks below
        (job(gpus=8, nodes=4, switches=0), "switches", "switches must be at least 1"),
        (job(gpus=8, nodes=4, switches=1, switches_wait_s=-1), "switches_wait_s", "at least 0"),
    ],
    ids=["not a multiple", "larger than every block", "too few whole segments", "ok", "switches 0", "wait<0"],
)
def test_topology_that_can_never_be_met_is_refused(spec: JobSpec, field: str, message: str | None) -> None:
    if message is None:
        validate_spec(spec, CLUSTER)
        with pytest.raises(InvalidInput) as info:
            validate_spec(spec, config(""))  # no blocks: every node is a block of one
        assert info.value.field == "segment" and "largest block: 1 nodes" in str(info.value)
        return
    with pytest.raises(InvalidInput) as info:
        validate_spec(spec, CLUSTER)
    assert info.value.field == field and message in str(info.value)


def test_the_new_fields_default_for_old_submissions() -> None:
    """A JobSpec encoded before the fields existed decodes with no topology constraint."""
    fields = msgspec.to_builtins(job())
    for name in ("switches", "switches_wait_s", "segment"):
        fields.pop(name, None)  # (defaults are not encoded anyway)
    decoded = msgspec.convert(fields, JobSpec)
    assert (decoded.switches, decoded.switches_wait_s, decoded.segment) == (None, None, None)


# --- squeue / scontrol show job -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "line"),
    [
        (job(gpus=8, nodes=4), None),
        (job(gpus=8, nodes=4, switches=1), "Switches=1@00:05:00"),
        (job(gpus=8, nodes=4, switches=2, switches_wait_s=60), "Switches=2@00:01:00"),
        (job(gpus=8, nodes=4, switches=1, switches_wait_s=86_400), "Switches=1@00:05:00"),
        (job(gpus=8, nodes=4, segment=2), "SegmentSize=2"),
        (job(gpus=8, nodes=4, switches=1, switches_wait_s=0, segment=4), "Switches=1@00:00:00 SegmentSize=4"),
    ],
    ids=["none", "default wait", "@60", "capped at max_switch_wait", "segment", "both"],
)
def test_show_job_prints_the_constraint(spec: JobSpec, line: str | None) -> None:
    log = Log(*cluster(nodes=4))
    log.add(submitted(1, spec))
    lines = show_job(job_info(log.state.jobs[1], Plan(), policy_of(CLUSTER)), T0, lambda user: None, UTC)
    found = [shown for shown in lines if shown.startswith(("Switches", "SegmentSize"))]
    assert (found[0] if found else None) == line
