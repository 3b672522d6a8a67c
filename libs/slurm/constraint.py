"""Slurm's ``--constraint`` on node features: ``a``, ``a&b`` (all of them), ``a|b`` (any of them).

Slurm's other forms (matching OR ``[a|b]``, counts ``a*2``, parentheses, mixing ``&`` and ``|``) are
refused with a message that says so, never read as something else.
"""

from __future__ import annotations

import re

from corral.libs.slurm.errors import FormatError
from corral.schemas.events import Constraint

_FEATURE = re.compile(r"[A-Za-z0-9_.-]+")
_FIX = "use FEATURE, FEATURE&FEATURE... (all of them) or FEATURE|FEATURE... (any of them)"


def parse_constraint(text: str, field: str = "--constraint") -> Constraint:
    """Return the constraint of a ``--constraint`` value.

    Raises FormatError for an empty or malformed value, a mix of ``&`` and ``|``, and the forms Corral
    does not support yet (``[...]``, ``*N``, parentheses).
    """
    value = text.strip()
    if any(c in value for c in "[]*()"):
        raise FormatError(
            field, text, f"brackets, counts and parentheses are not supported by Corral yet; {_FIX}"
        )
    if "&" in value and "|" in value:
        raise FormatError(field, text, f"mixing & and | is not supported by Corral yet; {_FIX}")
    any_of = "|" in value
    features = value.split("|" if any_of else "&")
    if not all(_FEATURE.fullmatch(f) for f in features):
        raise FormatError(field, text, _FIX)
    return Constraint(features=features, any_of=any_of)


def format_constraint(constraint: Constraint) -> str:
    """Print a constraint as ``--constraint`` takes it."""
    return ("|" if constraint.any_of else "&").join(constraint.features)
