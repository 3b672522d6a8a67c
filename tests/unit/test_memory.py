"""Memory sizes: Slurm's suffixes in, megabytes out, and Slurm's printing back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.libs.slurm.errors import FormatError
from corral.libs.slurm.memory import MAX_MEMORY_MB, format_memory, parse_memory

pytestmark = pytest.mark.unit

GB, TB, PB = 1024, 1024**2, 1024**3

PARSE_CASES = [
    ("8G", 8 * GB, "G"),
    ("8GB", 8 * GB, "GB"),
    ("15g", 15 * GB, "lower case"),
    ("8gb", 8 * GB, "lower case GB"),
    ("3584MB", 3584, "MB"),
    ("500M", 500, "M"),
    ("1024", 1024, "no unit is megabytes"),
    ("1T", TB, "T"),
    ("2P", 2 * PB, "P"),
    ("1K", 1, "K rounds up"),
    ("1024KB", 1, "KB exact"),
    ("1025k", 2, "K rounds up past a megabyte"),
    ("0", 0, "zero means all memory"),
    ("0G", 0, "zero with a unit"),
    (" 4G ", 4 * GB, "surrounding space"),
    ("0008G", 8 * GB, "leading zeros"),
]


@pytest.mark.parametrize(("text", "megabytes"), [c[:2] for c in PARSE_CASES], ids=[c[2] for c in PARSE_CASES])
def test_parse_memory(text: str, megabytes: int) -> None:
    assert parse_memory(text) == megabytes


BAD_SIZES = [
    ("", "empty"),
    ("-1", "negative"),
    ("-8G", "negative with unit"),
    ("1.5G", "fraction"),
    ("G", "unit only"),
    ("8 G", "inner space"),
    ("8B", "bytes"),
    ("8GiB", "binary suffix"),
    ("8X", "unknown unit"),
    ("8GBB", "double B"),
    ("+8G", "plus sign"),
    ("８G", "fullwidth digit"),
    ("8\u212a", "kelvin sign"),
    ("1025P", "too large"),
    ("9" * 5000, "huge number"),
]


@pytest.mark.parametrize("text", [c[0] for c in BAD_SIZES], ids=[c[1] for c in BAD_SIZES])
def test_parse_memory_rejects(text: str) -> None:
    with pytest.raises(FormatError, match='invalid --mem-per-gpu "') as caught:
        parse_memory(text, field="--mem-per-gpu")
    assert (caught.value.field, caught.value.value) == ("--mem-per-gpu", text)


def test_default_field_is_mem() -> None:
    with pytest.raises(FormatError, match=r'^invalid --mem "lots": use a whole number'):
        parse_memory("lots")


FORMAT_CASES = [
    (0, "0", "zero"),
    (500, "500M", "megabytes"),
    (3584, "3584M", "not whole gigabytes"),
    (8 * GB, "8G", "gigabytes"),
    (1536 * GB, "1536G", "not whole terabytes"),
    (TB, "1T", "terabytes"),
    (3 * PB, "3P", "petabytes"),
    (1024 * PB, "1024P", "no unit beyond P"),
]


@pytest.mark.parametrize(
    ("megabytes", "text"), [c[:2] for c in FORMAT_CASES], ids=[c[2] for c in FORMAT_CASES]
)
def test_format_memory(megabytes: int, text: str) -> None:
    assert format_memory(megabytes) == text


def test_format_memory_refuses_negative() -> None:
    with pytest.raises(ValueError, match="negative"):
        format_memory(-1)


@given(st.integers(0, MAX_MEMORY_MB))
def test_format_round_trips(megabytes: int) -> None:
    assert parse_memory(format_memory(megabytes)) == megabytes


@given(st.integers(0, 10**6), st.sampled_from(["", "M", "G", "T"]), st.sampled_from(["", "B"]), st.booleans())
def test_units_scale_by_1024(number: int, unit: str, b: str, lower: bool) -> None:
    text = f"{number}{unit}{b if unit else ''}"
    assert parse_memory(text.lower() if lower else text) == number * {"": 1, "M": 1, "G": GB, "T": TB}[unit]
