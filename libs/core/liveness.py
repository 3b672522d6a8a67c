"""Node liveness from heartbeats (pure): when health may call a node down, or up again.

A node is silent when health has heard nothing of it for longer than the node timeout. Health can only
hear while it is connected to NATS: while it is disconnected it cannot tell a silent node from its own
deafness, and the heartbeats sent meanwhile are lost to it. So silence is measured within the current
*listening window*, which opens when health connects (at its start, and at every reconnection):

- while health is disconnected (no window) it concludes nothing;
- an up node is down once nothing was heard of it (a heartbeat, or its registration) for more than
  ``timeout`` seconds, counted from the later of its last sign and the window's opening: after a
  reconnection every node gets a fresh ``timeout`` to heartbeat again;
- a down node is up again only on a heartbeat heard in the current window, less than ``timeout`` ago:
  a window that opens brings no node back by itself.

Times are monotonic seconds.
"""

from __future__ import annotations

from typing import Literal

Verdict = Literal["down", "up"] | None


def verdict(
    *,
    up: bool,
    sign: float | None,
    heartbeat: float | None,
    window: float | None,
    now: float,
    timeout: float,
) -> Verdict:
    """What to report of one node: ``"down"``, ``"up"`` or None (no change).

    ``up``: whether the node is up now; ``sign``: when its latest sign of life (heartbeat or registration)
    was heard, None if none; ``heartbeat``: when its latest heartbeat was heard, None if none; ``window``:
    when the current listening window opened, None while health is disconnected; ``now``: the time;
    ``timeout``: the node timeout (SlurmdTimeout).
    """
    if window is None:
        return None
    if up:
        last = window if sign is None else max(sign, window)
        return "down" if now - last > timeout else None
    if heartbeat is not None and heartbeat >= window and now - heartbeat < timeout:
        return "up"
    return None
