"""--signal values and signal names as sbatch and scancel take them."""

from __future__ import annotations

import signal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.libs.slurm.errors import FormatError
from corral.libs.slurm.signals import (
    DEFAULT_SECONDS_BEFORE,
    MAX_SECONDS_BEFORE,
    SignalSpec,
    parse_signal_name,
    parse_signal_option,
)

pytestmark = pytest.mark.unit

USR1, USR2, TERM = int(signal.SIGUSR1), int(signal.SIGUSR2), int(signal.SIGTERM)

OPTION_CASES = [
    ("USR1", SignalSpec(USR1, DEFAULT_SECONDS_BEFORE, False), "name"),
    ("SIGUSR1", SignalSpec(USR1, 60, False), "SIG prefix"),
    ("usr2", SignalSpec(USR2, 60, False), "lower case"),
    ("SIGUSR1@90", SignalSpec(USR1, 90, False), "lead time"),
    ("B:USR1@90", SignalSpec(USR1, 90, True), "batch only"),
    ("b:TERM", SignalSpec(TERM, 60, True), "lower-case flag"),
    ("R:10@30", SignalSpec(10, 30, False), "reservation flag and number"),
    ("RB:sigterm@0", SignalSpec(TERM, 0, True), "both flags"),
    ("BR:TERM@65535", SignalSpec(TERM, 65535, True), "largest lead time"),
    (" USR1@5 ", SignalSpec(USR1, 5, False), "surrounding space"),
]


@pytest.mark.parametrize(("text", "spec"), [c[:2] for c in OPTION_CASES], ids=[c[2] for c in OPTION_CASES])
def test_parse_signal_option(text: str, spec: SignalSpec) -> None:
    assert parse_signal_option(text) == spec


BAD_OPTIONS = [
    ("", "empty"),
    ("X:USR1", "unknown flag"),
    ("B:R:USR1", "two flag groups"),
    ("B:", "flag only"),
    ("FOO", "unknown name"),
    ("SIG", "bare SIG"),
    ("0", "signal zero"),
    ("999", "no such number"),
    ("USR1@", "empty lead time"),
    ("USR1@-1", "negative lead time"),
    ("USR1@1.5", "fractional lead time"),
    (f"USR1@{MAX_SECONDS_BEFORE + 1}", "lead time too large"),
    ("USR1@10@20", "two lead times"),
    ("@60", "lead time only"),
]


@pytest.mark.parametrize("text", [c[0] for c in BAD_OPTIONS], ids=[c[1] for c in BAD_OPTIONS])
def test_parse_signal_option_rejects(text: str) -> None:
    with pytest.raises(FormatError, match='invalid --signal "') as caught:
        parse_signal_option(text)
    assert (caught.value.field, caught.value.value) == ("--signal", text)


NAME_CASES = [
    ("TERM", TERM, "name"),
    ("SIGTERM", TERM, "SIG prefix"),
    ("sigusr2", USR2, "lower case"),
    ("KILL", int(signal.SIGKILL), "kill"),
    ("15", TERM, "number"),
    (" CONT ", int(signal.SIGCONT), "surrounding space"),
]


@pytest.mark.parametrize(("text", "signum"), [c[:2] for c in NAME_CASES], ids=[c[2] for c in NAME_CASES])
def test_parse_signal_name(text: str, signum: int) -> None:
    assert parse_signal_name(text) == signum


@pytest.mark.parametrize(
    "text",
    ["", "NOPE", "SIGSIGTERM", "0", "-15", "TERM@60", "B:TERM", "\u017fIGTERM", "SIG_DFL"],
    ids=["empty", "unknown", "double prefix", "zero", "negative", "lead time", "flag", "long s", "handler"],
)
def test_parse_signal_name_rejects(text: str) -> None:
    with pytest.raises(FormatError, match='invalid -s "') as caught:
        parse_signal_name(text, field="-s")
    assert (caught.value.field, caught.value.value) == ("-s", text)


@given(st.sampled_from(sorted(signal.Signals, key=int)), st.sampled_from(["SIG", "sig", ""]), st.booleans())
def test_every_signal_name_and_number(sig: signal.Signals, prefix: str, lower: bool) -> None:
    name = prefix + sig.name.removeprefix("SIG")
    assert parse_signal_name(name.lower() if lower else name) == int(sig)
    assert parse_signal_name(str(int(sig))) == int(sig)


@given(
    st.sampled_from(["", "B:", "R:", "RB:", "BR:"]),
    st.sampled_from([signal.SIGUSR1, signal.SIGTERM, signal.SIGINT]),
    st.one_of(st.none(), st.integers(0, MAX_SECONDS_BEFORE)),
)
def test_option_parts(flags: str, sig: signal.Signals, seconds: int | None) -> None:
    text = flags + sig.name + ("" if seconds is None else f"@{seconds}")
    expected = SignalSpec(int(sig), DEFAULT_SECONDS_BEFORE if seconds is None else seconds, "B" in flags)
    assert parse_signal_option(text) == expected
