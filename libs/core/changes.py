"""What the fold changed, for a consumer that keeps what it derived from the state across cycles.

``capacity.CapacityCache`` keeps every node's free capacity and plan from one cycle to the next. To find what
to build again it can compare every node and every run with a copy of it (by value: right whatever changed
them, and however), but that costs a pass over every node and every run in every cycle, most of them
unchanged. Instead the fold says what its entries touched: ``fold.apply`` notes, for each entry, the job it
names, and the node it names or else the nodes of that job's run before and after it (``touched``). Every
change the fold makes to a node's capacity or a run's nodes, limit or end is made by an entry about that job
or node (``tests/unit/test_changes.py`` checks it on random logs), so a consumer need only look again at
those.

The notes are kept only for a state someone follows (``follow``): a state nobody follows (a rebuild, a
query's copy) pays nothing. They are a journal of keys (a job id, or a node name) that a consumer reads from
its mark on (``since``). The journal is bounded: past ``LIMIT`` keys it starts again, and a consumer whose
mark is older than that (``since`` gives None) compares everything, as without it. A copy of the state
(``copy.copy``, ``msgspec.structs.replace``, a decoded snapshot) has no journal: it is another state.
"""

from __future__ import annotations

from collections.abc import Iterable

from corral.libs.core.state import State

#: Keys kept before the journal starts again (a consumer that reads every cycle never misses one).
LIMIT = 1 << 16


class Changes:
    """The keys the fold touched, in order: job ids (int) and node names (str)."""

    __slots__ = ("keys", "start")

    def __init__(self) -> None:
        self.keys: list[int | str] = []
        self.start = 0  # the position of ``keys[0]`` since the journal began

    @property
    def end(self) -> int:
        """The mark of a consumer that has read everything so far."""
        return self.start + len(self.keys)

    def since(self, mark: int) -> list[int | str] | None:
        """The keys touched from ``mark`` on; None if some of them were dropped (compare everything)."""
        if mark < self.start:
            return None
        return self.keys[mark - self.start :]

    def touched(self, job_id: int | None, nodes: Iterable[str]) -> None:
        """Note a job (None: no job) and nodes an entry may have changed."""
        keys = self.keys
        if len(keys) >= LIMIT:
            self.start += len(keys)
            keys.clear()
        if job_id is not None:
            keys.append(job_id)
        keys.extend(nodes)


def follow(state: State) -> Changes:
    """The journal of ``state``, started now if it had none (the fold notes changes from then on)."""
    changes = of(state)
    if changes is None:
        changes = vars(state)["changes"] = Changes()
    return changes


def of(state: State) -> Changes | None:
    """The journal of ``state``, if someone follows it."""
    return vars(state).get("changes")
