"""sbatch's refusals of input that used to be accepted and then fail the job: a NUL byte in the script, an
output directory the user cannot write; and the bound on an ``#SBATCH`` line."""

from __future__ import annotations

import pytest

from corral.cli.errors import CliError
from corral.cli.sbatch_script import check_script

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("data", "offset"),
    [(b"#!/bin/sh\necho a\x00b\n", 16), (b"#!/bin/sh\n\x00", 10), (b"#!/bin/sh\n#SBATCH -J \x00\n", 21)],
    ids=["in-a-command", "alone", "in-a-directive"],
)
def test_a_script_with_a_nul_byte_is_refused_naming_the_byte(data: bytes, offset: int) -> None:
    with pytest.raises(CliError) as refused:
        check_script(data)
    assert refused.value.message == (
        f"batch script contains a NUL byte (byte {offset}): a batch script must be text; "
        "remove the \\0 characters"
    )
