"""Fuzzing the two doors bad input comes through: ``#SBATCH`` lines into sbatch's parser, and submit-request
bytes into the gateway's decode and validation (an API client need not use sbatch).

The only failures allowed are the project's own input errors: ``CliError``/``FormatError`` (sbatch's
one-line error and exit 1) and ``DecodeError``/``InvalidInput``/``Forbidden`` (the gateway's error reply);
anything else would be a traceback or an "internal error" reply. A refused submission appends nothing, an
accepted one one entry. Example counts are modest and each example has a deadline, so that the default test
run stays short (4,000 examples each found nothing more once names were refused control characters).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.cli.errors import CliError
from corral.cli.sbatch_args import OPTIONS, build_submission, parse_command_line
from corral.libs.runtime.errors import Forbidden, InvalidInput
from corral.libs.slurm.errors import FormatError
from corral.schemas import api
from corral.schemas.codec import DecodeError, decode, encode
from tests.unit.builders import job
from tests.unit.rigs import Rig

pytestmark = pytest.mark.unit

FUZZ = settings(max_examples=100, deadline=timedelta(seconds=1), suppress_health_check=[HealthCheck.too_slow])

#: Long option names sbatch knows (implemented or not), so that lines reach the value parsers.
NAMES = sorted({name for name in OPTIONS._long})
#: Characters that matter to the parser: quotes, escapes, comments, separators, pattern and list syntax.
PUNCTUATION = [*" \t'\"\\#=,:;%@[]-+*?/.|&0123456789", "\x00", "\x0b", "é", "\u2028"]
values = st.text(alphabet=st.sampled_from(PUNCTUATION + list("abcGMKTkmgunowallALLNONE")), max_size=24)
option = st.one_of(
    st.builds(lambda n, v: f"--{n}={v}", st.sampled_from(NAMES), values),
    st.builds(lambda n, v: f"--{n} {v}", st.sampled_from(NAMES), values),
    st.builds(lambda s, v: f"-{s}{v}", st.sampled_from(sorted(OPTIONS._short)), values),
    values,
)
directive = st.lists(option, max_size=6).map(" ".join)


def sbatch_spec(lines: list[str]) -> None:
    """sbatch's parsing of a script made of ``#SBATCH`` lines (IO aside)."""
    script = "#!/bin/sh\n" + "".join(f"#SBATCH {line}\n" for line in lines) + "true\n"
    invocation = parse_command_line(["s.sh"])
    build_submission(invocation, script.encode(), environ={}, cwd="/home/alice", hostname="login1", now=0.0)


@FUZZ
@given(st.lists(directive, min_size=1, max_size=4))
def test_random_directives_give_a_spec_or_sbatch_s_own_error(lines: list[str]) -> None:
    try:
        sbatch_spec(lines)
    except (CliError, FormatError) as exc:
        message = exc.message if isinstance(exc, CliError) else str(exc)
        assert message and "\n" not in message, message  # one line, as run_command prints it


@FUZZ
@given(st.text(max_size=200))
def test_any_text_after_sbatch_gives_a_spec_or_sbatch_s_own_error(text: str) -> None:
    with contextlib.suppress(CliError, FormatError):
        sbatch_spec([text.replace("\n", " ")])


def submit_bytes(payload: bytes) -> tuple[BaseException | None, int]:
    """What the gateway does with one submit request's bytes (decode, then submit as alice): the error it
    raised (None: accepted), and how many entries it appended."""
    rig = Rig()
    try:
        request = decode(payload, api.SubmitRequest)
        asyncio.run(rig.gateway.submit("alice", msgspec.structs.replace(request, test_only=False)))
    except (DecodeError, InvalidInput, Forbidden) as exc:
        return exc, len(rig.log.bodies())
    return None, len(rig.log.bodies())


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes_are_a_decode_error(payload: bytes) -> None:
    error, appended = submit_bytes(payload)
    assert error is not None and appended == 0


#: A request the gateway accepts, as JSON, to mutate one field at a time.
GOOD_SPEC = job(nodes=1, gpus=1)
GOOD = json.loads(encode(api.SubmitRequest(token="t", spec=GOOD_SPEC)))
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64)
    | st.floats()
    | st.text(alphabet=st.sampled_from(PUNCTUATION + list("abc")), max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def mutated(changes: dict[str, Any]) -> bytes:
    """The good request with some of its spec's fields set to other JSON values."""
    body = json.loads(json.dumps(GOOD))
    body["spec"].update(changes)
    return json.dumps(body).encode()


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from([f.encode_name for f in msgspec.structs.fields(GOOD_SPEC)]), json_values, max_size=3
    )
)
def test_a_request_with_fields_of_any_json_is_accepted_or_refused(changes: dict[str, Any]) -> None:
    error, appended = submit_bytes(mutated(changes))
    assert appended == (0 if error is not None else 1), (error, appended)


#: One field of the spec set to any value of its type (most such requests decode, and reach validation).
typed_change = st.one_of(
    [st.tuples(st.just(f.name), st.from_type(f.type)) for f in msgspec.structs.fields(GOOD_SPEC)]
)


@FUZZ
@given(st.lists(typed_change, min_size=1, max_size=4))
def test_a_spec_with_fields_of_any_value_is_accepted_or_refused(changes: list[tuple[str, Any]]) -> None:
    try:
        payload = encode(
            api.SubmitRequest(token="t", spec=msgspec.structs.replace(GOOD_SPEC, **dict(changes)))
        )
    except (OverflowError, msgspec.EncodeError, TypeError):
        return  # a value no client could send (an integer beyond 64 bits, a mapping that is not a dict)
    error, appended = submit_bytes(payload)
    assert appended == (0 if error is not None else 1), (error, appended)
    if error is not None:
        assert str(error) and "\n" not in str(error), str(error)
