"""The ids events and API messages name jobs and nodes by."""

from __future__ import annotations

from typing import TypeAlias

#: A job id: positive, monotonic, never reused.
JobId: TypeAlias = int

#: A node name: one subject token.
NodeName: TypeAlias = str
