"""Chaos, bounded for CI: 60 short jobs (some on two nodes, most with GPUs) on ``corral up --ha`` while the
gateway, accounting, health, an agent, PostgreSQL, the leading scheduler, a NATS server and the scheduler
that took over are killed in turn, and the leader of then is paused past its lease (``chaos.TARGETS``).
Every invariant of ``chaos.py`` must hold: nothing lost or created twice, no
overlapping runs, no GPU held twice, sacct agrees with the scheduler, and no running job requeued by a
crash. The longer soak is ``bench/chaos_soak.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
from chaos import TARGETS, Chaos
from e2e_cli import Cli, user_env
from test_e2e_supervision import Up

pytestmark = pytest.mark.e2e


def test_killing_each_process_in_turn_under_load_breaks_no_invariant(tmp_path: Path) -> None:
    state, out = tmp_path / "state", tmp_path / "out"
    out.mkdir()
    env = user_env(state, commands_on_path=True)
    cli = Cli(env=env, workdir=tmp_path)
    up = Up(state, env, "--ha")
    try:
        up.wait_line("is up")
        chaos = Chaos(up, cli, out)
        figures = chaos.run(jobs=60, targets=TARGETS, spacing_s=2.0)
        states = chaos.wait_ended(timeout=120)
        problems = chaos.check()
        print(f"accepted {len(figures.accepted)}, refused {len(figures.refused)}, kills {figures.kills}")
        assert problems == [], problems
        assert set(states.values()) == {"COMPLETED"}, states
        assert [name for name, _ in figures.kills] == TARGETS
        # Each loss of the leader (killed, then the one that took over, then paused) was taken over.
        failovers = chaos.failovers()
        assert len(failovers) == len(figures.leader_lost) >= 2, (figures.leader_lost, failovers)
        # The paused scheduler was leading: it resumed to find its lease gone, and stood by.
        (paused,) = chaos.paused
        assert "lost the scheduler lease: standby" in (state / "logs" / f"{paused}.log").read_text()
    finally:
        status = up.stop()
    assert status == 0, "\n".join(up.lines[-40:])


def test_the_checks_catch_a_gpu_held_twice_and_a_job_run_twice(tmp_path: Path) -> None:
    # The harness's own check, on records the jobs could have written: it must be able to fail.
    (tmp_path / "7.0").write_text("start 7 0 node1 0,1 100.0\nend 7 0 node1 0,1 110.0\n")
    (tmp_path / "8.0").write_text("start 8 0 node1 1 105.0\nend 8 0 node1 1 106.0\n")
    (tmp_path / "9.0").write_text("start 9 0 node2 0 100.0\nend 9 0 node2 0 110.0\n")
    (tmp_path / "9.1").write_text("start 9 1 node2 2 109.0\nend 9 1 node2 2 120.0\n")
    (tmp_path / "10.0").write_text("start 10 0 node1 2 100.0\nend 10 0 node1 2 110.0\n")
    (tmp_path / "10.0.gpus").write_text("gpus 10 node1 2\ngpus 10 node2 0\n")  # its peer's GPU: 9's
    chaos = Chaos(up=None, cli=None, out=tmp_path)  # type: ignore[arg-type]
    assert sorted(chaos._overlaps()) == [
        "GPU 0 of node2 held by jobs 9 and 10 at once",
        "GPU 1 of node1 held by jobs 7 and 8 at once",
        "job 9 ran twice at once: [(100.0, 110.0), (109.0, 120.0)]",
    ]
    assert chaos.recorded() == {7, 8, 9, 10}
