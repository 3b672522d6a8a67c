"""Identity from the operating system (docs/decisions/identity.md): real Unix users with no credentials file
use the cluster through ``corral authd`` as themselves; forged, expired, borrowed and revoked tickets are
refused; rotation retires the old key and passwords while the services keep working.

Runs as root (CI does): the test creates its own Unix users with ``useradd`` and runs commands as them.
"""

from __future__ import annotations

import getpass
import json
import os
import pwd
import secrets
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cli import BIN, Cli, admin_cli, user_env

import corral
from corral.cli.local_cluster import LocalCluster, ensure_resolvable
from corral.cli.supervision import Supervisor
from corral.libs.runtime import tickets
from corral.libs.runtime.nats_request import Connection, NatsRequestError, request
from corral.schemas import subjects

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="creates Unix users (CI runs as root)")


@pytest.fixture(scope="module")
def shared() -> Iterator[Path]:
    """A directory every user may enter: the authd socket and the users' work directories."""
    path = Path(tempfile.mkdtemp(prefix="corral-ident-"))
    path.chmod(0o755)
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


@pytest.fixture(scope="module")
def people(shared: Path) -> Iterator[list[str]]:
    """Two real Unix users of our own, each with a work directory of theirs."""
    names = [f"idt{secrets.token_hex(3)}" for _ in range(2)]
    for name in names:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True)
        work = shared / name
        work.mkdir()
        info = pwd.getpwnam(name)
        os.chown(work, info.pw_uid, info.pw_gid)
    yield names
    for name in names:
        subprocess.run(["userdel", name], check=False)


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, shared: Path, people: list[str]
) -> Iterator[LocalCluster]:
    """A local cluster whose authd listens where the test's users can reach it."""
    cluster = LocalCluster(tmp_path_factory.mktemp("ident"), getpass.getuser(), nodes=1, gpus_per_node=2)
    cluster.auth_socket = shared / "authd.sock"
    assert ensure_resolvable([n.name for n in cluster.prepare().nodes]) is None
    cluster.start(ready_timeout=90)
    yield cluster
    cluster.stop()


def user_python() -> str:
    """An interpreter other users may run: ours, unless it lives where only root may enter (a pyenv under
    /root), then the system's of the same version (the venv's packages are ABI-compatible)."""
    path = Path(os.path.realpath(sys.executable))
    if all(parent.stat().st_mode & 0o001 for parent in path.parents):
        return sys.executable
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if not system.exists():
        pytest.skip("no Python interpreter other users may run")
    return str(system)


def our_packages() -> list[str]:
    """Where this Corral and its dependencies are, for ``user_python``'s ``sys.path``."""
    return [str(Path(corral.__file__).parents[1]), sysconfig.get_paths()["purelib"]]


def command(name: str) -> list[str]:
    """Corral's Slurm command ``name`` as another user can run it (``user_python``), with our packages."""
    code = (
        f"import sys; sys.path[:0] = {our_packages()!r}; sys.argv[0] = {name!r}\n"
        f"from corral.cli.launch import {name}; sys.exit({name}())"
    )
    return [user_python(), "-c", code]


def as_user(
    name: str, shared: Path, cluster: LocalCluster, *argv: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a command (``command(...)`` + arguments) as Unix user ``name``: no CORRAL_* but the authd socket,
    a home of their own, no credentials file anywhere they can read."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CORRAL_"))}
    env.update(
        HOME=str(shared / name),
        USER=name,
        LOGNAME=name,
        CORRAL_AUTH_SOCKET=str(cluster.auth.socket),
        CORRAL_CMD_SERVER="off",
    )
    return subprocess.run(
        [*argv],
        env=env,
        cwd=shared / name,
        user=name,
        group=pwd.getpwnam(name).pw_gid,
        extra_groups=[],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def login(cluster: LocalCluster, user: str, password: str) -> None:
    """One API call as ``user`` with ``password``; NatsRequestError if the server refuses the login."""
    assert cluster.nats is not None
    request(
        cluster.nats.url,
        subjects.api_subject("nodes", user),
        b"{}",
        user=user,
        password=password,
        inbox_prefix=subjects.inbox_prefix(user),
        timeout=5,
    )


def refusals(cluster: LocalCluster) -> dict[str, float]:
    """The auth callout's dead letters by reason, from its metrics."""
    text = urllib.request.urlopen(cluster.metrics_urls["auth"], timeout=5).read().decode()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("corral_dead_letters_total{") and 'service="auth"' in line:
            reason = line.split('reason="')[1].split('"')[0]
            counts[reason] = float(line.rsplit(" ", 1)[1])
    return counts


def refused_more(
    cluster: LocalCluster, before: dict[str, float], reasons: tuple[str, ...]
) -> dict[str, float]:
    """The dead letters by reason once each of ``reasons`` counts more than ``before`` (auth answers the
    server first, then sends its dead letter and counts it: a refused command may end before the count
    moves), or as they are after 10 s."""
    deadline = time.monotonic() + 10
    while True:
        counts = refusals(cluster)
        if all(counts.get(r, 0) > before.get(r, 0) for r in reasons) or time.monotonic() > deadline:
            return counts
        time.sleep(0.1)


def test_a_user_with_no_credentials_file_is_themselves(
    cluster: LocalCluster, shared: Path, people: list[str]
) -> None:
    alice = people[0]
    squeue = as_user(alice, shared, cluster, *command("squeue"))
    assert squeue.returncode == 0, squeue.stderr
    submitted = as_user(alice, shared, cluster, *command("sbatch"), "--parsable", stdin="#!/bin/sh\ntrue\n")
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    shown = as_user(alice, shared, cluster, *command("squeue"), "-h", "-j", job, "-o", "%u", "-t", "all")
    assert shown.returncode == 0, shown.stderr
    acct = as_user(alice, shared, cluster, *command("sacct"), "-j", job, "-X", "-n", "-P", "-o", "User")
    assert alice in (shown.stdout.strip(), acct.stdout.strip()), (shown.stdout, acct.stdout)


def test_authd_vouches_only_for_the_caller(cluster: LocalCluster, shared: Path, people: list[str]) -> None:
    alice, bob = people
    # Whatever the caller sends, the ticket is for the uid the kernel reports.
    probe = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        f"s.connect({str(cluster.auth.socket)!r})\n"
        'try:\n    s.sendall(b\'{"user": "root", "uid": 0}\\n\')\n'
        "except OSError:\n    pass  # authd does not read: it may have answered and closed already\n"
        "sys.stdout.write(s.makefile().readline())\n"
    )
    out = as_user(alice, shared, cluster, user_python(), "-c", probe)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["user"] == alice
    claims = tickets.verify(tickets.read_keys(cluster.auth.ticket_key), answer["password"], alice)
    assert claims.uid == pwd.getpwnam(alice).pw_uid
    # Alice's ticket does not let anyone log in as Bob.
    with pytest.raises(NatsRequestError, match="Authorization"):
        login(cluster, bob, answer["password"])
    # The key is root's alone: no user can read it to sign their own.
    info = cluster.auth.ticket_key.stat()
    assert (info.st_uid, info.st_mode & 0o777) == (0, 0o600)
    read = as_user(alice, shared, cluster, "cat", str(cluster.auth.ticket_key))
    assert read.returncode != 0


def test_forged_expired_and_borrowed_tickets_are_refused(cluster: LocalCluster, people: list[str]) -> None:
    alice, bob = people
    keys = tickets.read_keys(cluster.auth.ticket_key)
    uid = pwd.getpwnam(alice).pw_uid
    forged = tickets.issue(tickets.KeyFile(keys=[tickets.Key(keys.keys[0].id, "A" * 43)]), alice, uid)
    expired = tickets.issue(keys, alice, uid, ttl_s=10, now=time.time() - 60)
    borrowed = tickets.issue(keys, alice, uid)
    before = refusals(cluster)
    for user, password in ((alice, forged), (alice, expired), (bob, borrowed), (alice, "hunter2")):
        with pytest.raises(NatsRequestError, match="Authorization"):
            login(cluster, user, password)
    login(cluster, alice, tickets.issue(keys, alice, uid))  # the genuine one still works
    reasons = ("bad_signature", "expired", "wrong_user", "malformed")
    after = refused_more(cluster, before, reasons)
    for reason in reasons:
        assert after.get(reason, 0) > before.get(reason, 0), (reason, after)


def test_a_long_lived_client_gets_a_fresh_ticket_for_each_new_connection(
    cluster: LocalCluster, shared: Path, people: list[str]
) -> None:
    # An authd whose tickets live 2 s: a client that outlives its ticket (srun reattaching after a long
    # step) asks for another when it connects again, and the old one is refused by then.
    assert cluster.nats is not None
    socket = shared / "short.sock"
    argv = [sys.executable, "-m", "corral.cli.authd", "--socket", str(socket), "--ttl", "2"]
    argv += ["--key", str(cluster.auth.ticket_key), "--url", cluster.nats.url]
    authd = subprocess.Popen(argv, stderr=subprocess.DEVNULL)
    client = (
        "import sys, time\n"
        f"sys.path[:0] = {our_packages()!r}\n"
        "from corral.cli.client import find_cluster\n"
        "from corral.schemas.api import NodesReply, NodesRequest\n"
        f"env = {{'CORRAL_AUTH_SOCKET': {str(socket)!r}, 'CORRAL_STATE_DIR': '/nonexistent'}}\n"
        "client = find_cluster(env)\n"
        "first = client.credentials.password\n"
        "client.call('nodes', NodesRequest(), NodesReply)\n"
        "time.sleep(2.5)\n"
        "client.call('nodes', NodesRequest(), NodesReply)\n"
        "assert client.credentials.password != first\n"
        "print(first)\n"
    )
    try:
        deadline = time.monotonic() + 10
        while not socket.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        out = as_user(people[0], shared, cluster, user_python(), "-c", client)
        assert out.returncode == 0, out.stderr
        with pytest.raises(NatsRequestError, match="Authorization"):
            login(cluster, people[0], out.stdout.strip())  # the first ticket, expired by now
    finally:
        authd.terminate()
        authd.wait(10)


def test_the_callout_reads_nothing_but_the_revocations(cluster: LocalCluster) -> None:
    # It admits people; it has no business with the log (whole submissions: scripts and environments).
    assert cluster.nats is not None
    creds = json.loads(cluster.role_credentials("corral-auth").read_text())
    with pytest.raises(NatsRequestError, match=r"[Pp]ermissions"):
        request(
            cluster.nats.url,
            f"$JS.API.CONSUMER.CREATE.{subjects.EVENTS_STREAM}",
            b'{"stream_name": "CORRAL_EVENTS", "config": {"ack_policy": "none"}}',
            user="corral-auth",
            password=creds["password"],
            inbox_prefix=subjects.inbox_prefix("corral-auth"),
            timeout=3,
        )


def test_a_revoked_user_is_refused_and_cut_off(
    cluster: LocalCluster, shared: Path, people: list[str]
) -> None:
    bob = people[1]
    keys = tickets.read_keys(cluster.auth.ticket_key)
    ticket = tickets.issue(keys, bob, pwd.getpwnam(bob).pw_uid)
    assert cluster.nats is not None
    live = Connection(cluster.nats.url, user=bob, password=ticket, inbox_prefix=subjects.inbox_prefix(bob))
    live.subscribe(f"corral.io.{bob}.>")
    corral = str(BIN / "corral")
    revoked = subprocess.run(
        [corral, "credentials", "--state-dir", str(cluster.state_dir), "revoke", bob],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert revoked.returncode == 0, revoked.stderr
    assert "1 connection(s) closed" in revoked.stdout
    with pytest.raises(NatsRequestError):
        live.publish(subjects.api_subject("nodes", bob), b"{}")
        live.next_message(timeout=2)
    out = as_user(bob, shared, cluster, *command("squeue"))
    assert out.returncode != 0 and "Authorization" in out.stderr, out.stderr
    assert refused_more(cluster, {}, ("revoked",)).get("revoked", 0) >= 1
    restored = subprocess.run(
        [corral, "credentials", "--state-dir", str(cluster.state_dir), "restore", bob],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert restored.returncode == 0, restored.stderr
    assert as_user(bob, shared, cluster, *command("squeue")).returncode == 0


def test_rotation_retires_the_old_key_and_passwords(
    cluster: LocalCluster, shared: Path, people: list[str], tmp_path: Path
) -> None:
    alice = people[0]
    old_ticket = tickets.issue(tickets.read_keys(cluster.auth.ticket_key), alice, pwd.getpwnam(alice).pw_uid)
    old_password = json.loads(cluster.role_credentials("corral-gateway").read_text())["password"]
    # As under corral up: a service whose password was retired exits and is started again with its new one.
    supervisor = Supervisor(cluster, time.monotonic())
    rotated = subprocess.run(
        [str(BIN / "corral"), "credentials", "--state-dir", str(cluster.state_dir), "rotate", "--grace", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert rotated.returncode == 0, rotated.stderr
    with pytest.raises(NatsRequestError, match="Authorization"):
        login(cluster, alice, old_ticket)
    with pytest.raises(NatsRequestError, match="Authorization"):
        login(cluster, "corral-gateway", old_password)
    deadline = time.monotonic() + 60
    restarted: list[str] = []
    while time.monotonic() < deadline:
        restarted += [line for line in supervisor.tick(time.monotonic()) if "running again" in line]
        if restarted and not supervisor.missing():
            break
        time.sleep(0.3)
    assert any(line.startswith("gateway") for line in restarted), restarted
    cluster.wait_ready(60)
    # Users get tickets of the new key; the services are back with their new passwords: a job runs.
    out = as_user(alice, shared, cluster, *command("squeue"))
    assert out.returncode == 0, out.stderr
    cli = Cli(env=user_env(cluster.state_dir), workdir=tmp_path)
    job = cli.sbatch("#!/bin/sh\necho rotated\n")
    assert cli.wait_state(job, ("COMPLETED",), timeout=60).startswith("COMPLETED")
    assert admin_cli(cli, cluster)("squeue").returncode == 0
    # A NATS server that dies after the rotation comes back with the new passwords, not its old ones.
    assert cluster.nats is not None and cluster.nats.pid is not None
    os.kill(cluster.nats.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    back = False
    while time.monotonic() < deadline and not back:
        back = any("nats-server is running again" in line for line in supervisor.tick(time.monotonic()))
        time.sleep(0.3)
    assert back
    gateway = json.loads(cluster.role_credentials("corral-gateway").read_text())["password"]
    inbox = subjects.inbox_prefix("corral-gateway")
    Connection(cluster.nats.url, user="corral-gateway", password=gateway, inbox_prefix=inbox).close()
    with pytest.raises(NatsRequestError, match="Authorization"):
        login(cluster, "corral-gateway", old_password)
