"""GRES requests, --gpus values and sinfo's node GRES column."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.libs.slurm.errors import FormatError
from corral.libs.slurm.gres import (
    MAX_COUNT,
    GresRequest,
    format_gres,
    format_node_gres,
    parse_gpus_spec,
    parse_gres,
)

pytestmark = pytest.mark.unit


def gpu(count: int = 1, gpu_type: str | None = None) -> GresRequest:
    """A GPU request; the builder keeps the tables short."""
    return GresRequest("gpu", gpu_type, count)


PARSE_CASES = [
    ("gpu", [gpu()], "name only"),
    ("gpu:2", [gpu(2)], "count"),
    ("gpu:h100", [gpu(1, "h100")], "type only"),
    ("gpu:h100:4", [gpu(4, "h100")], "type and count"),
    ("gpu:0", [gpu(0)], "zero asks for none"),
    ("gpu:2,nic:1", [gpu(2), GresRequest("nic", None, 1)], "list"),
    ("gpu:a100:1,gpu:h100:2", [gpu(1, "a100"), gpu(2, "h100")], "two types"),
    ("gpu:2080ti:1", [gpu(1, "2080ti")], "type starting with a digit"),
    ("gpu:a100_80gb:8", [gpu(8, "a100_80gb")], "type punctuation"),
    ("none", [], "none"),
    (" gpu:2 ", [gpu(2)], "surrounding space"),
]


@pytest.mark.parametrize(("text", "requests"), [c[:2] for c in PARSE_CASES], ids=[c[2] for c in PARSE_CASES])
def test_parse_gres(text: str, requests: list[GresRequest]) -> None:
    assert parse_gres(text) == requests


BAD_GRES = [
    ("", "empty"),
    ("gpu:-1", "negative"),
    ("gpu:1.5", "fraction"),
    ("gpu:2x", "count with letters"),
    ("gpu:2080ti", "digit-first type without count"),
    ("gpu:", "empty type"),
    ("gpu::2", "empty type with count"),
    ("gpu:h100:", "empty count"),
    ("gpu:h100:x", "count not a number"),
    ("gpu:h100:4:1", "four fields"),
    (":2", "empty name"),
    ("2", "count only"),
    ("gpu,", "trailing comma"),
    ("gpu,,nic", "empty item"),
    ("gpu:2,gpu:3", "name twice"),
    ("gpu:h100:1,gpu:h100:1", "name and type twice"),
    ("gp u", "space in name"),
    (f"gpu:{MAX_COUNT + 1}", "too many"),
    ("gpu:" + "9" * 5000, "huge count"),
]


@pytest.mark.parametrize("text", [c[0] for c in BAD_GRES], ids=[c[1] for c in BAD_GRES])
def test_parse_gres_rejects(text: str) -> None:
    with pytest.raises(FormatError, match='invalid --tres-per-node "') as caught:
        parse_gres(text, field="--tres-per-node")
    assert (caught.value.field, caught.value.value) == ("--tres-per-node", text)


def test_gres_error_tells_the_form() -> None:
    with pytest.raises(FormatError, match=r'^invalid --gres "gpu:-1": use NAME\[:TYPE\]\[:COUNT\]'):
        parse_gres("gpu:-1")


@pytest.mark.parametrize(
    ("requests", "text"),
    [([gpu(4, "h100"), GresRequest("nic", None, 1)], "gpu:h100:4,nic:1"), ([gpu()], "gpu:1"), ([], "none")],
    ids=["list", "count always printed", "empty"],
)
def test_format_gres(requests: list[GresRequest], text: str) -> None:
    assert format_gres(requests) == text


GPUS_CASES = [
    ("4", (None, 4), "count"),
    ("h100:4", ("h100", 4), "type and count"),
    ("0", (None, 0), "zero"),
    ("2080ti:1", ("2080ti", 1), "digit-first type"),
]


@pytest.mark.parametrize(("text", "spec"), [c[:2] for c in GPUS_CASES], ids=[c[2] for c in GPUS_CASES])
def test_parse_gpus_spec(text: str, spec: tuple[str | None, int]) -> None:
    assert parse_gpus_spec(text) == spec


BAD_GPUS = [
    ("", "empty"),
    ("h100", "type without count"),
    (":4", "empty type"),
    ("-1", "negative"),
    ("h100:-1", "negative with type"),
    ("gpu:h100:4", "gres form"),
    ("h100:4,a100:2", "several types"),
    ("1.5", "fraction"),
    (str(MAX_COUNT + 1), "too many"),
]


@pytest.mark.parametrize("text", [c[0] for c in BAD_GPUS], ids=[c[1] for c in BAD_GPUS])
def test_parse_gpus_spec_rejects(text: str) -> None:
    with pytest.raises(FormatError, match='invalid --gpus-per-task "') as caught:
        parse_gpus_spec(text, field="--gpus-per-task")
    assert (caught.value.field, caught.value.value) == ("--gpus-per-task", text)


@pytest.mark.parametrize(
    ("gpu_type", "count", "text"),
    [("h100", 8, "gpu:h100:8"), (None, 8, "gpu:8"), (None, 0, "(null)"), ("h100", 0, "(null)")],
    ids=["typed", "untyped", "none", "typed none"],
)
def test_format_node_gres(gpu_type: str | None, count: int, text: str) -> None:
    assert format_node_gres(gpu_type, count) == text


NAMES = st.from_regex(r"[a-z][a-z0-9_.-]{0,6}", fullmatch=True)
TYPES = st.one_of(st.none(), st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,6}", fullmatch=True))
REQUESTS = st.lists(
    st.builds(GresRequest, NAMES, TYPES, st.integers(0, MAX_COUNT)),
    unique_by=lambda r: (r.name, r.type),
    max_size=5,
)


@given(REQUESTS)
def test_gres_round_trips(requests: list[GresRequest]) -> None:
    assert parse_gres(format_gres(requests)) == requests


@given(TYPES, st.integers(0, MAX_COUNT))
def test_gpus_spec_round_trips(gpu_type: str | None, count: int) -> None:
    text = f"{gpu_type}:{count}" if gpu_type else str(count)
    assert parse_gpus_spec(text) == (gpu_type, count)
