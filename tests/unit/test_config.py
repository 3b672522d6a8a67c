"""Cluster configuration: parsing a TOML file into nodes, partitions and timing, and refusing bad input."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from corral.libs.config.cluster import (
    ConfigError,
    NodeConfig,
    PartitionConfig,
    SchedulerConfig,
    load_config,
    local_config_text,
    parse_config,
)
from corral.libs.config.policy import policy_of

pytestmark = pytest.mark.unit

GB = 1024

FULL = """
[cluster]
name = "prod-1"
heartbeat_interval = 3
node_timeout = "0:30"
kill_wait = "1:00:00"

[[nodes]]
names = "gpu[01-04]"
cpus = 32
memory = "256G"
gpus = 8
gpu_type = "h100"
features = ["nvlink", "ib"]

[[nodes]]
names = "cpu[8-10],login"
cpus = 16
memory = "3584MB"

[[partitions]]
name = "gpu"
nodes = "gpu[01-04]"
default = true
max_time = "1-00:00:00"
default_time = "1:00:00"

[[partitions]]
name = "cpu"
nodes = "cpu[8-10]"
max_time = "30"

[[partitions]]
name = "all"
"""

GPU_NODES = ("gpu01", "gpu02", "gpu03", "gpu04")
CPU_NODES = ("cpu8", "cpu9", "cpu10", "login")
NODE = '[[nodes]]\nnames = "gpu[01-02]"\ncpus = 8\n'


def config_text(cluster: str = "", nodes: str | None = None, partitions: str = "") -> str:
    """A configuration of sections; nodes default to one valid table of gpu[01-02]."""
    if nodes is None:
        nodes = NODE
    return f"{cluster}\n{nodes}\n{partitions}\n"


def partition(name: str = "gpu", **keys: str) -> str:
    """One [[partitions]] table; values in ``keys`` are TOML literals."""
    lines = [f'name = "{name}"'] + [f"{k} = {v}" for k, v in keys.items()]
    return "[[partitions]]\n" + "\n".join(lines) + "\n"


def cluster(**keys: str) -> str:
    """The [cluster] table; values in ``keys`` are TOML literals."""
    return "[cluster]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items())


# --- a full valid configuration ---------------------------------------------------------------


def test_full_config_expands_every_node_in_config_order() -> None:
    config = parse_config(FULL)
    assert [n.name for n in config.nodes] == [*GPU_NODES, *CPU_NODES]


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ("gpu01", NodeConfig("gpu01", 32, 256 * GB, 8, "h100", ("nvlink", "ib"))),
        ("gpu04", NodeConfig("gpu04", 32, 256 * GB, 8, "h100", ("nvlink", "ib"))),
        ("cpu10", NodeConfig("cpu10", 16, 3584, 0, None, ())),
        ("login", NodeConfig("login", 16, 3584, 0, None, ())),
    ],
    ids=["first-gpu-node", "last-gpu-node", "cpu-node-unpadded-range", "node-without-range"],
)
def test_full_config_node_inventory(node: str, expected: NodeConfig) -> None:
    assert parse_config(FULL).node(node) == expected


@pytest.mark.parametrize(
    ("name", "nodes", "default", "max_time_s", "default_time_s"),
    [
        ("gpu", set(GPU_NODES), True, 86400, 3600),
        ("cpu", {"cpu8", "cpu9", "cpu10"}, False, 1800, None),
        ("all", {*GPU_NODES, *CPU_NODES}, False, None, None),
    ],
    ids=["gpu-default-with-times", "cpu-lone-number-is-minutes", "all-nodes-unlimited"],
)
def test_full_config_partitions(
    name: str, nodes: set[str], default: bool, max_time_s: int | None, default_time_s: int | None
) -> None:
    part = parse_config(FULL).partition(name)
    assert part is not None
    assert (set(part.nodes), part.default, part.max_time_s, part.default_time_s) == (
        nodes,
        default,
        max_time_s,
        default_time_s,
    )


def test_full_config_cluster_keys() -> None:
    config = parse_config(FULL, source="/etc/corral/cluster.toml")
    assert (config.name, config.heartbeat_interval_s, config.node_timeout_s, config.kill_wait_s) == (
        "prod-1",
        3.0,
        30.0,
        3600.0,
    )
    assert config.source == "/etc/corral/cluster.toml"


def test_full_config_partition_order_and_lookups() -> None:
    config = parse_config(FULL)
    assert [p.name for p in config.partitions] == ["gpu", "cpu", "all"]
    assert config.default_partition.name == "gpu"
    assert config.partitions_of("cpu9") == ["cpu", "all"]
    assert config.partition("nope") is None


def test_first_partition_is_the_default_when_none_is_marked() -> None:
    config = parse_config(config_text(partitions=partition("a") + partition("b")))
    assert config.default_partition.name == "a"


@pytest.mark.parametrize(
    ("key", "value", "seconds"),
    [
        ("heartbeat_interval", "3", 3.0),
        ("heartbeat_interval", "0.5", 0.5),
        ("node_timeout", '"0:45"', 45.0),
        ("node_timeout", '"2"', 120.0),
        ("kill_wait", '"1:02:03"', 3723.0),
        ("kill_wait", '"1-0"', 86400.0),
    ],
    ids=[
        "int-seconds",
        "float-seconds",
        "string-M:S",
        "string-lone-number-is-minutes",
        "string-H:M:S",
        "string-D-H",
    ],
)
def test_cluster_timing_as_numbers_and_slurm_time_strings(key: str, value: str, seconds: float) -> None:
    config = parse_config(config_text(cluster=cluster(**{key: value})))
    assert getattr(config, f"{key}_s") == seconds


def test_cluster_defaults_without_cluster_table() -> None:
    config = parse_config(NODE)
    assert (config.name, config.heartbeat_interval_s, config.node_timeout_s, config.kill_wait_s) == (
        "corral",
        2.0,
        10.0,
        5.0,
    )


def test_root_jobs_are_refused_unless_allowed() -> None:
    assert not parse_config(NODE).allow_root_jobs
    assert parse_config(config_text(cluster=cluster(allow_root_jobs="true"))).allow_root_jobs
    with pytest.raises(ConfigError, match=re.escape("cluster.allow_root_jobs")):
        parse_config(config_text(cluster=cluster(allow_root_jobs='"yes"')))


def test_memory_confinement_keys() -> None:
    default = parse_config(NODE)
    assert (default.constrain_ram_space, default.cgroup_root) == (False, "corral")
    config = parse_config(
        config_text(cluster=cluster(constrain_ram_space="true", cgroup_root='"site/corral"'))
    )
    assert (config.constrain_ram_space, config.cgroup_root) == (True, "site/corral")


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"constrain_ram_space": '"yes"'}, "cluster.constrain_ram_space: expected bool"),
        ({"cgroup_root": '"/sys/fs/cgroup/memory"'}, "cluster.cgroup_root: '/sys/fs/cgroup/memory' is not"),
        ({"cgroup_root": '"../up"'}, "cluster.cgroup_root: '../up' is not a relative path"),
        ({"cgroup_root": '""'}, "cluster.cgroup_root: '' is not"),
        ({"cgroup_root": "1"}, "cluster.cgroup_root: expected str"),
    ],
    ids=["not-a-bool", "absolute", "dot-dot", "empty", "not-a-string"],
)
def test_bad_memory_confinement_keys_are_named(keys: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(config_text(cluster=cluster(**keys)))


def test_node_defaults() -> None:
    assert parse_config('[[nodes]]\nnames = "n1"\ncpus = 2\n').node("n1") == NodeConfig(
        "n1", 2, 1 * GB, 0, None, ()
    )


def test_without_partitions_one_default_batch_partition_holds_every_node() -> None:
    config = parse_config(config_text(nodes=NODE + '[[nodes]]\nnames = "cpu1"\ncpus = 4\n'))
    assert config.partitions == (PartitionConfig("batch", ("gpu01", "gpu02", "cpu1"), True, None, None),)


# --- invalid input: ConfigError naming the key -------------------------------------------------

INVALID = [
    ("[[nodes]\nnames = 'x'\n", "cluster.toml", "invalid-toml-names-source"),
    (cluster(name='"c"'), "nodes", "no-nodes"),
    ("nodes = []\n", "nodes", "empty-nodes-list"),
    ('nodes = "gpu01"\n', "nodes", "nodes-not-a-list"),
    ("[[nodes]]\ncpus = 8\n", "nodes[0]: missing key 'names'", "missing-names"),
    ('[[nodes]]\nnames = "gpu01"\n', "nodes[0]: missing key 'cpus'", "missing-cpus"),
    (NODE + '[[nodes]]\nnames = "cpu1"\n', "nodes[1]: missing key 'cpus'", "missing-cpus-second-table"),
    ("[[nodes]]\nnames = 5\ncpus = 8\n", "nodes[0].names", "names-not-a-string"),
    ('[[nodes]]\nnames = "gpu01"\ncpus = "8"\n', "nodes[0].cpus", "cpus-a-string"),
    ('[[nodes]]\nnames = "gpu01"\ncpus = true\n', "nodes[0].cpus", "cpus-a-bool"),
    ('[[nodes]]\nnames = "gpu01"\ncpus = 0\n', "cpus", "zero-cpus"),
    ('[[nodes]]\nnames = "gpu01"\ncpus = 8\ngpus = -1\n', "gpus", "negative-gpus"),
    ('[[nodes]]\nnames = "gpu[01-"\ncpus = 8\n', "nodes[0].names", "bad-hostlist-unclosed"),
    ('[[nodes]]\nnames = "gpu[05-01]"\ncpus = 8\n', "nodes[0].names", "bad-hostlist-reversed-range"),
    ('[[nodes]]\nnames = "gpu.01"\ncpus = 8\n', "nodes[0].names", "node-name-not-a-token"),
    (NODE + 'memory = "lots"\n', "nodes[0].memory", "bad-memory"),
    (NODE + 'memory = "1.5G"\n', "nodes[0].memory", "fractional-memory"),
    (NODE + '[[nodes]]\nnames = "gpu02"\ncpus = 8\n', "'gpu02' is configured twice", "node-in-two-tables"),
    ('[[nodes]]\nnames = "gpu[01-02],gpu01"\ncpus = 8\n', "'gpu01' is configured twice", "node-twice-in-one"),
    (NODE + partition(nodes='"gpu[01-03]"'), "partitions[0].nodes", "partition-unknown-node"),
    (NODE + partition(nodes='"gpu[01"'), "partitions[0].nodes", "partition-bad-hostlist"),
    (NODE + "[[partitions]]\nnodes = 'ALL'\n", "partitions[0]: missing key 'name'", "partition-no-name"),
    (NODE + partition("gpu part"), "partitions[0].name", "partition-name-not-a-token"),
    ("partitions = []\n" + NODE, "partitions", "empty-partitions-list"),
    (NODE + partition("a", default="true") + partition("b", default="true"), "default", "two-defaults"),
    (NODE + partition(max_time='"forever"'), "partitions[0].max_time", "bad-max-time"),
    (NODE + partition(max_time='"1:2:3:4"'), "partitions[0].max_time", "max-time-four-fields"),
    (NODE + partition(default_time='"soon"'), "partitions[0].default_time", "bad-default-time"),
    (cluster(node_timeout="0") + NODE, "cluster.node_timeout", "zero-node-timeout"),
    (cluster(node_timeout="-5") + NODE, "cluster.node_timeout", "negative-node-timeout"),
    (cluster(node_timeout='"0"') + NODE, "cluster.node_timeout", "zero-node-timeout-string"),
    (cluster(node_timeout='"UNLIMITED"') + NODE, "cluster.node_timeout", "unlimited-node-timeout"),
    (cluster(node_timeout='"soon"') + NODE, "cluster.node_timeout", "unparsable-node-timeout"),
    (cluster(heartbeat_interval="0.0") + NODE, "cluster.heartbeat_interval", "zero-heartbeat"),
    (cluster(kill_wait="-1") + NODE, "cluster.kill_wait", "negative-kill-wait"),
    (cluster(name='"my cluster"') + NODE, "cluster.name", "cluster-name-with-space"),
    (cluster(name='""') + NODE, "cluster.name", "empty-cluster-name"),
    (cluster(name="7") + NODE, "cluster.name", "cluster-name-not-a-string"),
]


@pytest.mark.parametrize(("text", "key"), [c[:2] for c in INVALID], ids=[c[2] for c in INVALID])
def test_invalid_config_raises_config_error_naming_the_key(text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(key)):
        parse_config(text, source="cluster.toml")


# Invalid input that once loaded silently or crashed with something other than ConfigError.
ACCEPTED_OR_CRASHING = [
    pytest.param(
        '[[nodes]]\nnames = ""\ncpus = 8\n',
        "nodes[0].names",
        id="empty-names-gives-a-cluster-without-nodes",
    ),
    pytest.param(
        NODE + partition("gpu") + partition("gpu"),
        "partitions[1].name",
        id="partition-name-twice",
    ),
    pytest.param(
        NODE + partition(default='"false"'),
        "partitions[0].default",
        id="default-a-string",
    ),
    pytest.param(
        NODE + "gpus = true\n",
        "nodes[0].gpus",
        id="gpus-a-bool",
    ),
    pytest.param(
        NODE + 'features = "nvlink"\n',
        "nodes[0].features",
        id="features-a-string",
    ),
    pytest.param(
        cluster(node_timeout="nan") + NODE,
        "cluster.node_timeout",
        id="node-timeout-nan",
    ),
    pytest.param(
        "nodes = [1]\n",
        "nodes[0]",
        id="node-entry-not-a-table",
    ),
    pytest.param(
        "partitions = [1]\n" + NODE,
        "partitions[0]",
        id="partition-entry-not-a-table",
    ),
    pytest.param(
        "cluster = 1\n" + NODE,
        "cluster",
        id="cluster-not-a-table",
    ),
]


def test_an_unknown_key_is_named() -> None:
    with pytest.raises(ConfigError, match=r"nodes\[0\]: unknown key 'gpu'"):
        parse_config(NODE + "gpu = 8\n")


@pytest.mark.parametrize(("text", "key"), ACCEPTED_OR_CRASHING)
def test_invalid_config_the_parser_lets_through(text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(key)):
        parse_config(text)


# --- load_config ------------------------------------------------------------------------------


def test_load_config_missing_file_names_the_path() -> None:
    path = Path("/nonexistent-corral-test-dir/cluster.toml")
    with pytest.raises(ConfigError, match=re.escape(str(path))):
        load_config(path)


# --- local_config_text ------------------------------------------------------------------------

LOCAL = [
    ("local", ["node1", "node2", "node3"], 4, 8, 16000),
    ("dev", ["sim01", "sim03", "sim10"], 8, 64, 512 * GB),
    ("cpu-only", ["box"], 0, 2, 1),
]


@pytest.mark.parametrize(
    ("name", "nodes", "gpus", "cpus", "mem_mb"), LOCAL, ids=["contiguous", "gaps-padded", "one-node-no-gpus"]
)
def test_local_config_text_round_trips(
    name: str, nodes: list[str], gpus: int, cpus: int, mem_mb: int
) -> None:
    config = parse_config(local_config_text(name, nodes, gpus, cpus, mem_mb))
    assert config.name == name
    assert config.nodes == tuple(NodeConfig(n, cpus, mem_mb, gpus, "sim", ()) for n in nodes)
    assert config.partitions == (PartitionConfig("gpu", tuple(nodes), True, None, None),)
    assert (config.heartbeat_interval_s, config.node_timeout_s, config.kill_wait_s) == (1.0, 6.0, 3.0)
    assert config.constrain_ram_space  # corral up confines runs (its stop removes their cgroups)
    assert not config.allow_root_jobs  # only when asked (corral up started by root)
    assert parse_config(
        local_config_text(name, nodes, gpus, cpus, mem_mb, allow_root_jobs=True)
    ).allow_root_jobs
    assert config.scheduler.backfill_resolution_s == SchedulerConfig().backfill_resolution_s


def test_local_config_text_takes_the_demos_node_timeout_and_backfill_resolution() -> None:
    text = local_config_text("local", ["node1", "node2"], 4, 8, 16000, node_timeout=4, backfill_resolution=1)
    config = parse_config(text)
    assert (config.heartbeat_interval_s, config.node_timeout_s) == (1.0, 4.0)
    assert config.scheduler.backfill_resolution_s == 1


def test_scheduler_policy_keys() -> None:
    text = (
        '[scheduler]\nbackfill = "conservative"\nbackfill_window = "2:00:00"\npriority_weight_age = 1000\n'
        'priority_max_age = "1-00:00:00"\npriority_favor_small = true\n'
        + NODE
        + '\n[[partitions]]\nname = "gpu"\npriority_tier = 5\n'
    )
    config = parse_config(text)
    assert config.scheduler.backfill == "conservative"
    assert config.scheduler.backfill_window_s == 7200
    assert config.scheduler.weight_age == 1000 and config.scheduler.max_age_s == 86400
    assert config.scheduler.favor_small is True
    assert config.partitions[0].priority_tier == 5
    assert parse_config(NODE).scheduler.backfill == "easy"  # Slurm's default is backfill, EASY-style


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[scheduler]\nbackfill = "greedy"\n', "scheduler.backfill"),
        ("[scheduler]\npriority_weight_age = -1\n", "scheduler.priority_weight_age"),
        ('[scheduler]\nbackfill_window = "soon"\n', "scheduler.backfill_window"),
        ("[scheduler]\nbogus = 1\n", "scheduler: unknown key 'bogus'"),
        ("[scheduler]\nbackfill_depth = 0\n", "scheduler.backfill_depth: expected a whole number >= 1"),
        ('[scheduler]\nbackfill_depth = "all"\n', "or \"UNLIMITED\", got 'all'"),
        ("[scheduler]\nbackfill_depth = 1.5\n", "scheduler.backfill_depth"),
        ("[scheduler]\nbackfill_depth = true\n", "scheduler.backfill_depth: expected a whole number"),
    ],
    ids=[
        *("unknown-mode", "minus-weight", "bad-window", "unknown-key"),
        *("depth-0", "depth-str", "depth-1.5", "depth-bool"),
    ],
)
def test_bad_scheduler_policy_is_named(text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(key)):
        parse_config(text + NODE)


@pytest.mark.parametrize(
    ("value", "depth"), [(None, 500), ("20", 20), ('"UNLIMITED"', None), ('"unlimited"', None)]
)
def test_conservative_backfills_depth_is_slurms_bf_max_job_test_by_default(
    value: str | None, depth: int | None
) -> None:
    text = FULL + ("" if value is None else f"\n[scheduler]\nbackfill_depth = {value}\n")
    config = parse_config(text)
    assert config.scheduler.backfill_depth == depth
    assert policy_of(config).backfill_depth == depth


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("86400", 86400), ('"60"', 3600), ('"1-00:00:00"', 86400), ("90.5", 91), ('"UNLIMITED"', None)],
    ids=["number-is-seconds", "string-number-is-minutes", "slurm-format", "fraction-rounds-up", "unlimited"],
)
def test_a_toml_number_is_seconds_and_a_string_is_slurms_format(value: str, seconds: int | None) -> None:
    text = FULL + f"\n[scheduler]\nbackfill_window = {value}\n"
    assert parse_config(text).scheduler.backfill_window_s == seconds


def test_accounting_partitions_and_lease() -> None:
    config = parse_config("[accounting]\npartitions = 2\nlease_ttl = 1.5\n" + NODE)
    assert (config.accounting.partitions, config.accounting.lease_ttl_s) == (2, 1.5)
    assert parse_config(NODE).accounting.partitions == 1  # one projection named accounting, as before


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[accounting]\npartitions = 0\n", "accounting.partitions: must be 1 to 64, got 0"),
        ('[accounting]\npartitions = "2"\n', "accounting.partitions: expected int"),
        ("[accounting]\nlease_ttl = 0.1\n", "accounting.lease_ttl: must be 0.5 to 300 seconds"),
        ("[accounting]\nreplicas = 2\n", "accounting: unknown key 'replicas'"),
    ],
    ids=["no-partition", "not-a-number", "ttl-too-short", "unknown-key"],
)
def test_bad_accounting_keys_are_named(text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(key)):
        parse_config(text + NODE)


def test_lookups_by_node_and_by_user_answer_as_a_pass_over_the_tables_would() -> None:
    # Each submission asks the user's accounts and each sinfo (and agent registration, and a new job shape
    # at the gateway) every node's partitions: the configuration answers from indexes (a site has thousands
    # of nodes and accounts; a pass per question was quadratic), with the passes' answers and order.
    nodes = "\n".join(f'[[nodes]]\nnames = "{g}[1-40]"\ncpus = 8\nmemory = "16G"\n' for g in ("a", "b"))
    parts = [("p1", "a[1-30]"), ("p2", "a[20-40],b[1-10]"), ("p3", "b[1-40]"), ("p4", "a[5]")]
    partitions = "\n".join(f'[[partitions]]\nname = "{n}"\nnodes = "{h}"\n' for n, h in parts)
    accounts = [("ml", ["alice", "bob"]), ("cv", ["bob", "carol"]), ("nlp", ["dave"]), ("all", ["bob"])]
    table = "\n".join(
        f'[[accounts]]\nname = "{a}"\nparent = "root"\nusers = [{", ".join(repr(u) for u in users)}]\n'
        for a, users in accounts
    ).replace("'", '"')
    config = parse_config(f"{nodes}\n{partitions}\n{table}")
    for node in config.nodes:
        assert config.partitions_of(node.name) == [p.name for p in config.partitions if node.name in p.nodes]
        assert config.node(node.name) is node
    assert config.partitions_of("zz9") == [] and config.partitions_of("a5") == ["p1", "p4"]
    with pytest.raises(KeyError):
        config.node("zz9")
    assert config.names == tuple(sorted(n.name for n in config.nodes))
    for user in ("alice", "bob", "carol", "dave", "erin"):
        listing = [a.name for a in config.accounts if user in a.users]
        assert config.accounts_of(user) == (listing or [user])
        assert config.default_account(user) == (listing[0] if listing else user)
    assert config.accounts_of("bob") == ["ml", "cv", "all"]
    assert config.account("cv") is config.accounts[1] and config.account("nope") is None
    assert config.may_use("bob", "all") and not config.may_use("alice", "cv")
