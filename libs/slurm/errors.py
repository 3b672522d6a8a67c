"""The one error of the Slurm-format library.

Hierarchy::

    ValueError
    └── FormatError      a value written in a Slurm format could not be read

Every parser in `corral.libs.slurm` raises `FormatError` and nothing else for bad input. It carries the
option or field that held the value (`field`, e.g. ``--time``), the value itself (`value`) and how to
write it correctly (`fix`), so a command can print it as is and a service can map it to an "invalid
request" reply without parsing the message.
"""

from __future__ import annotations

# Values are quoted in messages; a hostlist can be megabytes long, so the message shows only its start.
_MAX_SHOWN = 80


class FormatError(ValueError):
    """A value in a Slurm format is malformed or out of bounds.

    The message reads ``invalid FIELD "VALUE": FIX``.
    """

    # The option or field name the value came from, e.g. "--time" or "hostlist".
    field: str
    # The offending value, exactly as given.
    value: str
    # What a valid value looks like, in words a user can act on.
    fix: str

    def __init__(self, field: str, value: str, fix: str) -> None:
        self.field = field
        self.value = value
        self.fix = fix
        shown = value if len(value) <= _MAX_SHOWN else value[:_MAX_SHOWN] + "…"
        super().__init__(f'invalid {field} "{shown}": {fix}')

    def __reduce__(self) -> tuple[type[FormatError], tuple[str, str, str]]:
        # The default reduce passes the message as the only argument, which __init__ does not accept.
        return (FormatError, (self.field, self.value, self.fix))
