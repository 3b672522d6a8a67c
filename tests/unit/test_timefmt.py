"""Time limits, durations and timestamps in Slurm's formats; also the FormatError they raise."""

from __future__ import annotations

import pickle
from datetime import UTC, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.libs.slurm.errors import FormatError
from corral.libs.slurm.timefmt import (
    MAX_TIME_LIMIT,
    format_elapsed,
    format_elapsed_sacct,
    format_time_limit,
    format_timestamp,
    parse_time_limit,
)

pytestmark = pytest.mark.unit

MINUTE, HOUR, DAY = 60, 3600, 86400

PARSE_CASES = [
    ("5", 5 * MINUTE, "M"),
    ("90", 90 * MINUTE, "M over an hour"),
    ("5:30", 5 * MINUTE + 30, "M:S"),
    ("0:10", 10, "seconds only"),
    ("1:00:00", HOUR, "H:M:S"),
    ("2:03:04", 2 * HOUR + 3 * MINUTE + 4, "H:M:S all fields"),
    ("1-0", DAY, "D-H"),
    ("1-2", DAY + 2 * HOUR, "D-H hours"),
    ("1-2:3", DAY + 2 * HOUR + 3 * MINUTE, "D-H:M"),
    ("1-02:03:04", DAY + 2 * HOUR + 3 * MINUTE + 4, "D-H:M:S"),
    ("0:75", 75, "fields may overflow"),
    (" 10 ", 10 * MINUTE, "surrounding space"),
    ("007", 7 * MINUTE, "leading zeros"),
]


@pytest.mark.parametrize(("text", "seconds"), [c[:2] for c in PARSE_CASES], ids=[c[2] for c in PARSE_CASES])
def test_parse_time_limit(text: str, seconds: int) -> None:
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize(
    "text", ["UNLIMITED", "unlimited", "Infinite", "-1", "0", "0:00", "0-0:0:0"], ids=lambda t: t
)
def test_parse_no_limit(text: str) -> None:
    assert parse_time_limit(text) is None


BAD_TIMES = [
    ("", "empty"),
    ("1:2:3:4", "four fields"),
    ("1-2:3:4:5", "days and four fields"),
    ("1-", "dash without hours"),
    ("-5", "negative"),
    ("1-2-3", "two dashes"),
    ("1::2", "empty field"),
    ("1.5", "fraction"),
    ("+5", "plus sign"),
    ("5m", "unit"),
    ("１", "fullwidth digit"),
    ("1 0", "inner space"),
    ("never", "word"),
    (str(MAX_TIME_LIMIT // 60 + 1), "too long"),
]


@pytest.mark.parametrize("text", [c[0] for c in BAD_TIMES], ids=[c[1] for c in BAD_TIMES])
def test_parse_time_limit_rejects(text: str) -> None:
    with pytest.raises(FormatError, match='invalid TimeLimit "') as caught:
        parse_time_limit(text, field="TimeLimit")
    assert (caught.value.field, caught.value.value) == ("TimeLimit", text)


def test_error_message_names_field_value_and_fix() -> None:
    with pytest.raises(FormatError) as caught:
        parse_time_limit("1:2:3:4")
    assert str(caught.value) == 'invalid --time "1:2:3:4": use M, M:S, H:M:S, D-H, D-H:M or D-H:M:S'


def test_format_error_pickles_and_shortens_long_values() -> None:
    error = FormatError("hostlist", "x" * 1000, "fix it")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.field, copy.value, copy.fix, str(copy)) == ("hostlist", "x" * 1000, "fix it", str(error))
    assert len(str(error)) < 120
    assert isinstance(error, ValueError)


SHORT_CASES = [
    (0, "0:00", "zero"),
    (3, "0:03", "seconds"),
    (30 * MINUTE, "30:00", "minutes"),
    (HOUR, "1:00:00", "hour"),
    (10 * HOUR + 5, "10:00:05", "hours"),
    (DAY, "1-00:00:00", "day"),
    (DAY + 2 * HOUR + 3 * MINUTE + 4, "1-02:03:04", "all fields"),
    (400 * DAY, "400-00:00:00", "many days"),
    (-1, "INVALID", "negative"),
]


@pytest.mark.parametrize(("seconds", "text"), [c[:2] for c in SHORT_CASES], ids=[c[2] for c in SHORT_CASES])
def test_format_elapsed(seconds: int, text: str) -> None:
    assert format_elapsed(seconds) == text
    assert format_time_limit(seconds) == text


def test_format_no_limit() -> None:
    assert format_time_limit(None) == "UNLIMITED"


SACCT_CASES = [
    (0, "00:00:00", "zero"),
    (3, "00:00:03", "seconds"),
    (HOUR + 2 * MINUTE, "01:02:00", "hours"),
    (DAY + 2 * HOUR + 3 * MINUTE + 4, "1-02:03:04", "days"),
    (-5, "INVALID", "negative"),
]


@pytest.mark.parametrize(("seconds", "text"), [c[:2] for c in SACCT_CASES], ids=[c[2] for c in SACCT_CASES])
def test_format_elapsed_sacct(seconds: int, text: str) -> None:
    assert format_elapsed_sacct(seconds) == text


@pytest.mark.parametrize(
    ("unix", "tz", "text"),
    [
        (1_796_056_616, UTC, "2026-11-30T16:36:56"),
        (1_796_056_616.9, UTC, "2026-11-30T16:36:56"),
        (1_796_056_616, timezone(timedelta(hours=-5)), "2026-11-30T11:36:56"),
        (None, UTC, "Unknown"),
        (0, UTC, "Unknown"),
    ],
    ids=["utc", "fraction dropped", "other zone", "none", "zero"],
)
def test_format_timestamp(unix: float | None, tz: timezone, text: str) -> None:
    assert format_timestamp(unix, tz) == text


def test_format_timestamp_defaults_to_local_time() -> None:
    assert len(format_timestamp(1_796_056_616)) == len("2026-11-30T16:36:56")


LIMITS = st.integers(1, MAX_TIME_LIMIT)


@given(LIMITS)
def test_short_format_round_trips(seconds: int) -> None:
    assert parse_time_limit(format_time_limit(seconds)) == seconds


@given(LIMITS)
def test_sacct_format_round_trips(seconds: int) -> None:
    assert parse_time_limit(format_elapsed_sacct(seconds)) == seconds


@given(st.integers(0, 999), st.integers(0, 99), st.integers(0, 99), st.integers(0, 99))
def test_parse_days_hours_minutes_seconds(days: int, hours: int, minutes: int, seconds: int) -> None:
    total = days * DAY + hours * HOUR + minutes * MINUTE + seconds
    assert parse_time_limit(f"{days}-{hours}:{minutes}:{seconds}") == (total or None)
