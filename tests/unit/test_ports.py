"""free_port: a port outside the kernel's ephemeral range, which outgoing connections take from."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from corral.libs.infra import ports


def test_a_free_port_is_below_the_ephemeral_range_and_can_be_bound() -> None:
    first, last = ports.ephemeral_range()
    for _ in range(200):
        port = ports.free_port()
        assert ports.LOWEST <= port < first, (port, first, last)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports.free_port()))


def test_a_process_is_never_given_the_same_port_twice_whatever_seeds_random() -> None:
    state = random.getstate()
    try:
        random.seed(7)
        seeded = [ports.free_port() for _ in range(5)]
        random.seed(7)
        assert not set(seeded) & {ports.free_port() for _ in range(5)}
    finally:
        random.setstate(state)
    # A local cluster picks every service's metrics port before any of them binds its own: with random
    # picks, 2,000 ports held nowhere would repeat (~90 times among ~22,000).
    ports_given = [ports.free_port() for _ in range(2000)]
    assert len(set(ports_given)) == len(ports_given)


def test_without_room_below_the_range_the_kernel_picks_a_new_one_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (ports.LOWEST + 1, 60999))
    ports_given = [ports.free_port() for _ in range(200)]
    assert len(set(ports_given)) == len(ports_given)


def test_a_port_in_use_is_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", ports.free_port()))
        taken = held.getsockname()[1]
        monkeypatch.setattr(ports._random, "sample", lambda population, k: [taken, taken + 1])
        monkeypatch.setattr(ports, "TRIES", 2)
        assert ports.free_port() != taken


def test_the_range_is_read_from_the_kernel_and_defaults_without_it(tmp_path: Path) -> None:
    path = tmp_path / "range"
    path.write_text("40000\t50000\n")
    assert ports.ephemeral_range(path) == (40000, 50000)
    assert ports.ephemeral_range(tmp_path / "missing") == ports.DEFAULT_EPHEMERAL
    path.write_text("garbage\n")
    assert ports.ephemeral_range(path) == ports.DEFAULT_EPHEMERAL


def test_without_room_below_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (ports.LOWEST + 1, 60999))
    port = ports.free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
