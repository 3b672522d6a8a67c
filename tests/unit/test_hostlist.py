"""Hostlists: expansion as Slurm does it, the canonical compressed form, and their round trips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.libs.slurm.errors import FormatError
from corral.libs.slurm.hostlist import MAX_HOSTS, compress, expand, first

pytestmark = pytest.mark.unit

EXPAND_CASES = [
    ("", [], "empty"),
    ("login", ["login"], "single name"),
    ("gpu[001-004,010]", ["gpu001", "gpu002", "gpu003", "gpu004", "gpu010"], "padded ranges"),
    ("n[8-10]", ["n8", "n9", "n10"], "unpadded low bound"),
    ("n[08-10]", ["n08", "n09", "n10"], "padding from low bound"),
    ("n[1-010]", [f"n{i}" for i in range(1, 11)], "high bound padding ignored"),
    ("a[1-2],b3", ["a1", "a2", "b3"], "two items"),
    ("a[1-2] b3\tc", ["a1", "a2", "b3", "c"], "whitespace separators"),
    ("a,,b", ["a", "b"], "empty item skipped"),
    ("rack[1-2]-gpu[01-02]", ["rack1-gpu01", "rack1-gpu02", "rack2-gpu01", "rack2-gpu02"], "cartesian"),
    ("n[1-2][5-6]", ["n15", "n16", "n25", "n26"], "adjacent brackets"),
    ("n[2,1,2]", ["n2", "n1", "n2"], "order and duplicates kept"),
    ("[1-3]", ["1", "2", "3"], "no prefix"),
    ("node-a_1.x", ["node-a_1.x"], "punctuation"),
    ("n[7]", ["n7"], "one-number bracket"),
]


@pytest.mark.parametrize(
    ("hostlist", "hosts"), [c[:2] for c in EXPAND_CASES], ids=[c[2] for c in EXPAND_CASES]
)
def test_expand(hostlist: str, hosts: list[str]) -> None:
    assert expand(hostlist) == hosts


COMPRESS_CASES = [
    ([], "", "empty"),
    (["gpu001", "gpu002", "gpu003", "gpu004", "gpu010"], "gpu[001-004,010]", "padded runs"),
    (["gpu010", "gpu002", "gpu001", "gpu002"], "gpu[001-002,010]", "sorted and deduplicated"),
    (["n9", "n10"], "n[9-10]", "unpadded widths combine"),
    (["n09", "n10"], "n[09-10]", "padded low bound"),
    (["gpu098", "gpu099", "gpu100"], "gpu[098-100]", "unpadded joins padded width"),
    (["n1", "n01"], "n[1,01]", "distinct paddings"),
    (["n5"], "n5", "single numbered host has no bracket"),
    (["b3", "a2", "a1"], "a[1-2],b3", "prefixes sorted"),
    (["rack10-a1", "rack2-a1"], "rack2-a1,rack10-a1", "natural prefix order"),
    (["gpu2", "gpu", "login", "gpu1"], "gpu,gpu[1-2],login", "name without digits first"),
    (["rack1-gpu01", "rack1-gpu02", "rack2-gpu01"], "rack1-gpu[01-02],rack2-gpu01", "digits inside prefix"),
    (["3", "1", "2"], "[1-3]", "numeric names"),
    (["n0", "n1"], "n[0-1]", "zero is unpadded"),
]


@pytest.mark.parametrize(
    ("hosts", "hostlist"), [c[:2] for c in COMPRESS_CASES], ids=[c[2] for c in COMPRESS_CASES]
)
def test_compress(hosts: list[str], hostlist: str) -> None:
    assert compress(hosts) == hostlist


@pytest.mark.parametrize(
    ("hostlist", "host"),
    [("gpu[003-004],a1", "gpu003"), ("r[2-3]-g[07-09]", "r2-g07"), ("x", "x"), (f"n[1-{MAX_HOSTS}]", "n1")],
    ids=["bracket", "cartesian", "plain", "largest"],
)
def test_first(hostlist: str, host: str) -> None:
    assert first(hostlist) == host


BAD_HOSTLISTS = [
    ("n[1-2", "unclosed"),
    ("n1-2]", "unopened"),
    ("n[[1-2]]", "nested"),
    ("n[3-1]", "backwards"),
    ("n[]", "empty bracket"),
    ("n[a-b]", "letters in bracket"),
    ("n[1-2-3]", "double dash"),
    ("n[1,]", "trailing comma in bracket"),
    ("n[-1]", "negative"),
    ("n[ 1]", "space in bracket"),
    ("gpu!1", "bad character"),
    ("gpu/1", "slash"),
    ("n[1-2]é", "non-ascii"),
    (f"n[1-{MAX_HOSTS + 1}]", "too many in one range"),
    ("n[1-1000][1-1001]", "too many in a product"),
    (f"a[1-{MAX_HOSTS}],b", "too many in total"),
    ("x" * 256, "name too long"),
    ("n[" + "1" * 5000 + "]", "huge number"),
]


@pytest.mark.parametrize("hostlist", [c[0] for c in BAD_HOSTLISTS], ids=[c[1] for c in BAD_HOSTLISTS])
def test_expand_rejects(hostlist: str) -> None:
    with pytest.raises(FormatError, match="invalid --nodelist") as caught:
        expand(hostlist, field="--nodelist")
    assert (caught.value.field, caught.value.value) == ("--nodelist", hostlist)


@pytest.mark.parametrize("hostlist", ["", " , ", "n[", "a!"], ids=["empty", "separators", "bad", "bad char"])
def test_first_rejects(hostlist: str) -> None:
    with pytest.raises(FormatError, match="invalid -w"):
        first(hostlist, field="-w")


@pytest.mark.parametrize(
    "host", ["", "a,b", "n[1]", "a b", "x" * 256], ids=["empty", "comma", "bracket", "space", "long"]
)
def test_compress_rejects(host: str) -> None:
    with pytest.raises(FormatError, match="invalid hostlist") as caught:
        compress(["ok1", host])
    assert caught.value.value == host


def test_compress_refuses_a_str() -> None:
    with pytest.raises(TypeError):
        compress("gpu1")


# Prefixes without digits, so Slurm's natural prefix order is plain string order.
PREFIXES = st.text(alphabet="abgpu-._", max_size=5)


@st.composite
def uniform_hosts(draw: st.DrawFn) -> list[str]:
    """Hosts where each prefix has one naming scheme: zero-padded to a width, or unpadded."""
    hosts = []
    for prefix in draw(st.lists(PREFIXES, min_size=1, max_size=4, unique=True)):
        width = draw(st.sampled_from([0, 2, 3, 4]))
        numbers = draw(st.lists(st.integers(0, 10**width - 1 if width else 5000), min_size=1, max_size=40))
        hosts += [prefix + str(n).zfill(width) for n in numbers]
    return draw(st.permutations(hosts))


@given(uniform_hosts())
def test_expand_of_compress_is_sorted_unique(hosts: list[str]) -> None:
    def key(host: str) -> tuple[str, int]:
        prefix = host.rstrip("0123456789")
        return prefix, int(host[len(prefix) :])

    assert expand(compress(hosts)) == sorted(set(hosts), key=key)


# Any names, digits anywhere, numbers with or without leading zeros, names without trailing digits.
NAMES = st.builds(
    lambda prefix, digits: prefix + digits,
    st.text(alphabet="ab1-", max_size=4),
    st.one_of(st.just(""), st.text(alphabet="0123456789", min_size=1, max_size=4)),
).filter(bool)


@given(st.lists(NAMES, max_size=60))
def test_compress_is_canonical(hosts: list[str]) -> None:
    hostlist = compress(hosts)
    expanded = expand(hostlist)
    assert sorted(expanded) == sorted(set(hosts))
    assert compress(expanded) == hostlist
    assert compress(reversed(hosts)) == hostlist
    if hosts:
        assert first(hostlist) == expanded[0]
