"""``scontrol create reservation``, ``scontrol delete ReservationName=`` and ``scontrol show reservation``.

- ``create reservation ReservationName=X StartTime=now|TIME Duration=TIME|EndTime=TIME
  Nodes=LIST|NodeCnt=N|TRES=gres/gpu=N Users=a,b Accounts=c PartitionName=p Flags=MAINT,IGNORE_JOBS``
  (keys in any case, as in Slurm; admins only) goes to the gateway (verb ``create_reservation``), which
  answers once the scheduler decided: ``Reservation X created`` or Slurm's ``Error creating the
  reservation: ...``;
- ``delete ReservationName=X`` (verb ``delete_reservation``) prints nothing on success, as Slurm;
- ``show reservation[s] [X]`` prints Slurm's record of each reservation (``-o``: one line each) from the
  scheduler's ``reservations`` verb.

Parsing and rendering are pure (``create_request``, ``delete_name``, ``show_reservation``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from datetime import tzinfo
from typing import TYPE_CHECKING

from corral.cli.errors import CliError
from corral.libs.slurm import hostlist
from corral.libs.slurm.timefmt import (
    format_elapsed_sacct,
    format_timestamp,
    parse_begin_time,
    parse_time_limit,
)

if TYPE_CHECKING:
    from corral.schemas.api import CreateReservationRequest, ReservationInfo

#: Keys of ``create reservation`` (lower case) Corral understands; Slurm's others are refused by name.
_KEYS = frozenset(
    {
        "reservationname", "reservation", "res", "starttime", "duration", "endtime", "nodes", "nodecnt",
        "tres", "users", "accounts", "partitionname", "partition", "flags",
    }
)  # fmt: skip


def _pairs(words: Sequence[str], command: str) -> dict[str, tuple[str, str]]:
    """``KEY=VALUE`` words by lower-case key: (key as given, value)."""
    values: dict[str, tuple[str, str]] = {}
    for word in words:
        key, eq, value = word.partition("=")
        if not eq:
            raise CliError(f"scontrol {command} {word}: use KEY=VALUE")
        values[key.lower()] = (key, value)
    return values


def _names(text: str) -> list[str]:
    return [n for n in text.split(",") if n]


def create_request(words: Sequence[str], now: float, tz: tzinfo | None = None) -> CreateReservationRequest:
    """The request of ``scontrol create reservation KEY=VALUE ...`` (``now`` for ``StartTime=now``)."""
    from corral.schemas.api import CreateReservationRequest

    values = _pairs(words, "create reservation")
    for lower, (key, _) in values.items():
        if lower not in _KEYS:
            raise CliError(f"scontrol create reservation: {key}= is not supported by Corral yet")

    def get(*names: str) -> str | None:
        for name in names:
            if name in values:
                return values[name][1]
        return None

    name = get("reservationname", "reservation", "res")
    if not name:
        raise CliError("scontrol create reservation needs ReservationName=NAME")
    start_text = get("starttime")
    if start_text is None:
        raise CliError("scontrol create reservation needs StartTime= (now, or a time)")
    start = parse_begin_time(start_text, now, "StartTime", tz)
    duration_text, end_text = get("duration"), get("endtime")
    if (duration_text is None) == (end_text is None):
        raise CliError("scontrol create reservation needs one of Duration= or EndTime=")
    if duration_text is not None:
        duration = parse_time_limit(duration_text, "Duration")
        if duration is None:
            raise CliError(f"Duration={duration_text}: give a finite duration")
        end = start + duration
    else:
        assert end_text is not None
        end = parse_begin_time(end_text, now, "EndTime", tz)
    nodes_text, count_text, tres_text = get("nodes"), get("nodecnt"), get("tres")
    if sum(x is not None for x in (nodes_text, count_text, tres_text)) != 1:
        raise CliError("scontrol create reservation needs one of Nodes=, NodeCnt= or TRES=gres/gpu=N")
    nodes = hostlist.expand(nodes_text) if nodes_text is not None else []
    count = _count(count_text, "NodeCnt") if count_text is not None else 0
    gpus = 0
    if tres_text is not None:
        kind, eq, amount = tres_text.partition("=")
        if not eq or kind.lower() not in ("gres/gpu", "gpu"):
            raise CliError(f"TRES={tres_text}: only TRES=gres/gpu=N is supported by Corral yet")
        gpus = _count(amount, "TRES")
    partition = get("partitionname", "partition")
    flags = [f.upper() for f in _names(get("flags") or "")]
    return CreateReservationRequest(
        name=name,
        start_time=start,
        end_time=end,
        nodes=nodes,
        node_count=count,
        gpu_count=gpus,
        partition=partition or None,
        users=_names(get("users") or ""),
        accounts=_names(get("accounts") or ""),
        flags=flags,
    )


def _count(text: str, key: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise CliError(f"{key}={text}: give a positive number")
    return int(text)


def delete_name(words: Sequence[str]) -> str:
    """The reservation of ``scontrol delete ReservationName=X`` (also ``Reservation=X``)."""
    values = _pairs(words, "delete")
    for name, (key, _) in values.items():
        if name not in ("reservationname", "reservation"):
            raise CliError(f"scontrol delete {key}= is not supported by Corral yet: use ReservationName=")
    value = values.get("reservationname", values.get("reservation", ("", "")))[1]
    if not value:
        raise CliError("scontrol delete needs ReservationName=NAME")
    return value


def _list(items: Sequence[str]) -> str:
    return ",".join(items) if items else "(null)"


def show_reservation(resv: ReservationInfo, tz: tzinfo | None = None) -> list[str]:
    """The lines of ``scontrol show reservation`` for one reservation (Slurm's keys, in Slurm's order)."""
    tres = f"gres/gpu={resv.gpus}" if resv.gpus else "(null)"
    return [
        f"ReservationName={resv.name} StartTime={format_timestamp(resv.start_time, tz)} "
        f"EndTime={format_timestamp(resv.end_time, tz)} "
        f"Duration={format_elapsed_sacct(int(resv.end_time - resv.start_time))}",
        f"Nodes={hostlist.compress(resv.nodes) if resv.nodes else '(null)'} NodeCnt={len(resv.nodes)} "
        f"CoreCnt=0 Features=(null) PartitionName={resv.partition or '(null)'} Flags={_list(resv.flags)}",
        f"TRES={tres}",
        f"Users={_list(resv.users)} Groups=(null) Accounts={_list(resv.accounts)} Licenses=(null) "
        f"State={'ACTIVE' if resv.active else 'INACTIVE'} BurstBuffer=(null)",
        "MaxStartDelay=(null)",
    ]


def create(words: Sequence[str]) -> int:
    """Run ``scontrol create reservation ...``."""
    from corral.cli.client import find_cluster
    from corral.schemas.api import ReservationReply

    if not words or words[0].partition("=")[0].lower() not in ("reservation", "res", "reservationname"):
        raise CliError("scontrol create: only 'create reservation' is supported by Corral yet")
    rest = list(words[1:]) if "=" not in words[0] else list(words)
    reply = find_cluster().call("create_reservation", create_request(rest, time.time()), ReservationReply)
    print(f"Reservation {reply.name} created")
    return 0


def delete(words: Sequence[str]) -> int:
    """Run ``scontrol delete ReservationName=X``."""
    from corral.cli.client import find_cluster
    from corral.schemas.api import DeleteReservationRequest, ReservationReply

    find_cluster().call(
        "delete_reservation", DeleteReservationRequest(name=delete_name(words)), ReservationReply
    )
    return 0


def show(words: Sequence[str], oneliner: bool) -> int:
    """Run ``scontrol show reservation [NAME]``."""
    from corral.cli.client import find_cluster
    from corral.schemas.api import ReservationsReply, ReservationsRequest

    if len(words) > 1:
        raise CliError(f"unexpected argument '{words[1]}' after the reservation name")
    reply = find_cluster().call("reservations", ReservationsRequest(names=list(words[:1])), ReservationsReply)
    if not reply.reservations:
        if words:
            raise CliError(f"Reservation {words[0]} not found")
        print("No reservations in the system")
        return 0
    out = []
    for resv in reply.reservations:
        lines = show_reservation(resv)
        out.append(" ".join(lines) + "\n" if oneliner else "\n   ".join(lines) + "\n\n")
    sys.stdout.write("".join(out))
    return 0
