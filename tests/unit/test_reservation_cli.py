"""Reservations at the edges: scontrol's parsing and record, the gateway's checks (no cluster needed)."""

from __future__ import annotations

from datetime import UTC
from typing import Any

import pytest
from builders import T0, cluster_config

from corral.cli.errors import CliError
from corral.cli.sbatch_args import build_submission, parse_command_line
from corral.cli.scontrol_resv import create_request, delete_name, show_reservation
from corral.libs.runtime.errors import InvalidInput
from corral.libs.slurm.errors import FormatError
from corral.schemas import api
from corral.services.gateway.reservations import check_create

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("words", "wanted"),
    [
        (
            ["ReservationName=maint", "StartTime=now", "Duration=60", "Nodes=gpu[01-02]", "Users=alice,bob"],
            {"nodes": ["gpu01", "gpu02"], "end_time": T0 + 3600, "users": ["alice", "bob"]},
        ),
        (
            ["reservationname=r", "starttime=now+1hour", "duration=1-00:00:00", "nodecnt=2", "accounts=ml"],
            {"start_time": T0 + 3600, "end_time": T0 + 3600 + 86400, "node_count": 2, "accounts": ["ml"]},
        ),
        (
            ["Res=r", "StartTime=now", "EndTime=now+30min", "TRES=gres/gpu=4", "Users=a", "Flags=maint"],
            {"gpu_count": 4, "end_time": T0 + 1800, "flags": ["MAINT"]},
        ),
        (
            [
                "ReservationName=r",
                "StartTime=now",
                "Duration=1:00:00",
                "NodeCnt=1",
                "Users=a",
                "PartitionName=cpu",
            ],
            {"partition": "cpu", "end_time": T0 + 3600},
        ),
    ],
)
def test_create_request(words: list[str], wanted: dict[str, Any]) -> None:
    req = create_request(words, T0)
    for key, value in {"start_time": T0, **wanted}.items():
        assert getattr(req, key) == value, key


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["StartTime=now", "Duration=60", "NodeCnt=1"], "needs ReservationName="),
        (["ReservationName=r", "Duration=60", "NodeCnt=1"], "needs StartTime="),
        (["ReservationName=r", "StartTime=now", "NodeCnt=1"], "one of Duration= or EndTime="),
        (["ReservationName=r", "StartTime=now", "Duration=60"], "one of Nodes=, NodeCnt= or TRES="),
        (["ReservationName=r", "StartTime=now", "Duration=60", "NodeCnt=0"], "NodeCnt=0: give a positive"),
        (["ReservationName=r", "StartTime=now", "Duration=60", "TRES=cpu=4"], "only TRES=gres/gpu=N"),
        (["ReservationName=r", "StartTime=now", "Duration=UNLIMITED", "NodeCnt=1"], "Duration=UNLIMITED"),
        (["ReservationName=r", "StartTime=now", "Duration=60", "NodeCnt=1", "Licenses=x"], "Licenses="),
        (["ReservationName=r", "bogus"], "use KEY=VALUE"),
    ],
)
def test_create_request_refusals(words: list[str], message: str) -> None:
    with pytest.raises(CliError, match=message):
        create_request(words, T0)


def test_a_bad_time_names_the_key() -> None:
    with pytest.raises(FormatError, match="StartTime"):
        create_request(["ReservationName=r", "StartTime=someday", "Duration=60", "NodeCnt=1"], T0)


@pytest.mark.parametrize(
    ("words", "wanted"),
    [(["ReservationName=r"], "r"), (["reservation=x"], "x"), (["JobId=3"], None), ([], None)],
)
def test_delete_name(words: list[str], wanted: str | None) -> None:
    if wanted is None:
        with pytest.raises(CliError):
            delete_name(words)
    else:
        assert delete_name(words) == wanted


def test_show_reservation_is_slurms_record() -> None:
    resv = api.ReservationInfo(
        name="maint",
        start_time=T0,
        end_time=T0 + 3600,
        nodes=["gpu01", "gpu02"],
        gpus=0,
        partition="gpu",
        users=["alice"],
        accounts=[],
        flags=["MAINT"],
        active=True,
    )
    assert show_reservation(resv, UTC) == [
        "ReservationName=maint StartTime=2023-11-14T22:13:20 EndTime=2023-11-14T23:13:20 Duration=01:00:00",
        "Nodes=gpu[01-02] NodeCnt=2 CoreCnt=0 Features=(null) PartitionName=gpu Flags=MAINT",
        "TRES=(null)",
        "Users=alice Groups=(null) Accounts=(null) Licenses=(null) State=ACTIVE BurstBuffer=(null)",
        "MaxStartDelay=(null)",
    ]


def request(**fields: Any) -> api.CreateReservationRequest:
    base: dict[str, Any] = {"name": "r", "start_time": T0, "end_time": T0 + 3600, "node_count": 1}
    base["users"] = ["alice"]
    base.update(fields)
    return api.CreateReservationRequest(**base)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"name": "a.b"}, "ReservationName"),
        ({"node_count": 0}, "Nodes"),
        ({"gpu_count": 2}, "Nodes"),  # two of Nodes=/NodeCnt=/TRES=
        ({"node_count": 0, "nodes": ["gpu99"]}, "Nodes"),
        ({"partition": "nope"}, "PartitionName"),
        ({"end_time": T0}, "EndTime"),
        ({"start_time": T0 - 7200, "end_time": T0 - 3600}, "EndTime"),
        ({"users": []}, "Users"),
        ({"users": ["a b"]}, "Users"),
        ({"flags": ["OVERLAP"]}, "Flags"),
    ],
)
def test_the_gateway_refuses_what_can_never_be_reserved(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        check_create(request(**fields), cluster_config(nodes=2), T0)
    assert caught.value.field == field


@pytest.mark.parametrize(
    "fields",
    [{}, {"node_count": 0, "nodes": ["gpu01"]}, {"node_count": 0, "gpu_count": 3, "accounts": ["ml"]}],
)
def test_the_gateway_accepts_a_sound_request(fields: dict[str, Any]) -> None:
    check_create(request(**fields), cluster_config(nodes=2), T0)


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [(["--reservation=maint"], "maint"), (["--reservation", "r2"], "r2"), ([], None)],
)
def test_sbatch_reservation(argv: list[str], wanted: str | None) -> None:
    invocation = parse_command_line([*argv, "--wrap", "true"])
    submission = build_submission(invocation, None, environ={}, cwd="/", hostname="h", now=T0)
    assert submission.spec.reservation == wanted
