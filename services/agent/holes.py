"""Giving back the disk space of a file's consumed beginning, without moving what follows (Linux).

A step's spool file (``services/agent/stepdir.py``) is written by its task for as long as the task runs and
read by the agent from an offset; a chatty training run would otherwise keep every byte it ever printed on
the node's disk until the step ends. ``punch(path, end)`` deallocates ``[0, end)`` with
``fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)``: the size, the offsets and the bytes after
``end`` stay as they are (the hole reads as zeros), so the writer and the saved offsets are unaffected.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable
from functools import cache

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


@cache
def _fallocate() -> Callable[[int, int, int, int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        func = libc.fallocate
    except (OSError, AttributeError):
        return None
    func.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    func.restype = ctypes.c_int
    return func  # a foreign function, typed by its argtypes


def punch(path: str | os.PathLike[str], end: int) -> bool:
    """Deallocate the first ``end`` bytes of the file; False if the system or file system cannot."""
    func = _fallocate()
    if func is None or end <= 0:
        return False
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return False
    try:
        return bool(func(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, 0, end) == 0)
    finally:
        os.close(fd)
