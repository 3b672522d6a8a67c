"""``corral up --ha``: three clustered NATS servers with every stream at 3 replicas, two gateways and two
health services. One NATS server is killed in the middle of a stream of submissions: every accepted job
completes exactly once, and accounting has each of them."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from e2e_cli import Cli, user_env
from test_e2e_supervision import Up, child_pid

from corral.libs.runtime import tickets
from corral.libs.runtime.credentials import read_credentials
from corral.libs.runtime.nats_request import request
from corral.libs.runtime.streams import connect
from corral.schemas import subjects

pytestmark = pytest.mark.e2e

JOBS = 40


def stream_replicas(state: Path) -> dict[str, int]:
    async def read() -> dict[str, int]:
        nc = await connect(read_credentials(state / "credentials" / "roles" / "corral-admin.json"), name="t")
        try:
            js = nc.jetstream()
            names = (
                subjects.EVENTS_STREAM,
                subjects.WORK_STREAM,
                subjects.DLQ_STREAM,
                f"KV_{subjects.IDS_BUCKET}",
            )
            return {n: (await js.stream_info(n)).config.num_replicas or 1 for n in names}
        finally:
            await nc.close()

    return asyncio.run(read())


def ticket_login_on_every_server(state: Path) -> None:
    """Each of the three servers hands a person's login to the auth callout, whichever server it is on."""
    ticket = tickets.issue(tickets.read_keys(state / "auth" / "ticket.key"), "hauser", 4242)
    for i in (1, 2, 3):
        url = f"nats://127.0.0.1:{(state / f'nats-{i}' / 'port').read_text().strip()}"
        subject = subjects.api_subject("nodes", "hauser")
        reply = request(
            url, subject, b"{}", user="hauser", password=ticket, inbox_prefix=subjects.inbox_prefix("hauser")
        )
        assert b"nodes" in reply.data, (i, reply.data)


def test_losing_one_nats_server_mid_load_loses_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = user_env(state)
    cli = Cli(env=env, workdir=tmp_path)
    up = Up(state, env, "--ha")
    try:
        up.wait_line("is up")
        assert set(stream_replicas(state).values()) == {3}
        ticket_login_on_every_server(state)
        accepted: list[int] = []
        refused: list[str] = []

        def submit() -> None:
            for _ in range(JOBS):
                deadline = time.monotonic() + 30
                while True:
                    out = cli("sbatch", "--parsable", "--gres=gpu:1", stdin="#!/bin/bash\ntrue\n")
                    if out.returncode == 0:
                        accepted.append(int(out.stdout))
                        break
                    refused.append(out.stderr.strip())
                    assert time.monotonic() < deadline, refused[-1]
                    time.sleep(0.5)

        load = threading.Thread(target=submit)
        load.start()
        while len(accepted) < 10 and load.is_alive():
            time.sleep(0.1)
        os.kill(child_pid(up.proc.pid, "nats-2/nats.conf"), signal.SIGKILL)  # one server of three
        load.join(300)
        assert not load.is_alive() and len(accepted) == JOBS, (len(accepted), refused)
        assert len(set(accepted)) == JOBS  # no id given twice
        for job in accepted:
            assert cli.wait_state(job, ("COMPLETED",), timeout=120) == "COMPLETED|0:0", job
        rows = cli("sacct", "-X", "-n", "-P", "-o", "JobID,State", "-S", "2020-01-01").stdout.split()
        assert sorted(rows) == sorted(f"{job}|COMPLETED" for job in accepted)  # each once, none more
        up.wait_line("corral-nats-2 is running again")
        print(f"{len(refused)} submissions refused during the failover: {refused[:3]}")
    finally:
        status = up.stop()
    assert status == 0, "\n".join(up.lines)
