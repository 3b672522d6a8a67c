"""Punching the consumed beginning of a spool file gives its disk space back and keeps the rest."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.services.agent.holes import punch

pytestmark = pytest.mark.unit

MIB = 1 << 20


def test_the_punched_beginning_is_freed_and_the_rest_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "out.0"
    tail = b"the last line\n"
    with open(path, "wb") as fh:
        fh.write(os.urandom(4 * MIB) + tail)
        fh.flush()
        os.fsync(fh.fileno())
    before = os.stat(path)
    if not punch(path, 3 * MIB):
        pytest.skip("this file system cannot punch holes")
    after = os.stat(path)
    assert after.st_size == before.st_size  # offsets are unchanged
    assert after.st_blocks * 512 <= before.st_blocks * 512 - 3 * MIB
    with open(path, "rb") as fh:
        assert fh.read(16) == bytes(16)  # the hole reads as zeros
        fh.seek(4 * MIB)
        assert fh.read() == tail
    # A writer that appends goes on at the end.
    with open(path, "ab") as fh:
        fh.write(b"more\n")
    assert path.read_bytes().endswith(tail + b"more\n")


def test_nothing_to_punch(tmp_path: Path) -> None:
    assert not punch(tmp_path / "missing", MIB)
    (tmp_path / "empty").write_bytes(b"")
    assert not punch(tmp_path / "empty", 0)
