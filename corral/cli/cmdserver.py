"""The command server (``cmdclient.py`` has the why and the exchange): one per user and installation, it loads
every served command once, then keeps a child forked ahead for the next request, which becomes the client's
command and runs it (``cmdchild.py``).

``python -m corral.cli.cmdserver SOCKET IDENTITY-IN-HEX`` is what the client's ``start_server`` runs. It
exits after ``CORRAL_CMD_SERVER_IDLE`` seconds without a request (600), on SIGTERM, and once a module it
loaded changed on disk.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from typing import IO, NoReturn

from corral.cli import cmdchild
from corral.cli.cmdclient import PROTOCOL, mount_namespace, peer_uid, private_dir

#: Seconds a server waits for a request before it exits.
DEFAULT_IDLE = 600.0
#: Seconds at most between a spare taking a command and the next spare's fork (sooner when the command ends or
#: another client waits).
NEXT_SPARE_S = 0.05
#: Modules a server loads besides the served commands: what they import inside functions.
PRELOAD = (
    "corral.cli.client",
    "corral.cli.sacct_json",
    "corral.cli.sbatch_args",
    "corral.cli.scontrol_nodes",
    "corral.cli.scontrol_resv",
    "grp",
    "pwd",
)


class _Server:
    """What the server loaded and what it must stay equal to."""

    def __init__(self, path: str, ident: str) -> None:
        self.path = path
        self.ident = ident
        self.mount_namespace = mount_namespace()
        self.watched: list[tuple[str, int, int]] = []

    def load(self) -> None:
        """Load every served command and what it imports later, and note the files they came from."""
        import importlib

        from corral.cli import client, launch

        for command in launch.SERVED:
            launch.load(command)
        for name in PRELOAD:
            importlib.import_module(name)
        client.prepare_decoding()  # once here, not in every child
        files = {sys.executable}
        for name, module in list(sys.modules.items()):
            origin = getattr(module, "__file__", None)
            if origin and (name.startswith("corral") or name.startswith("msgspec")):
                files.add(origin)
        for origin in sorted(files):
            info = os.stat(origin)
            self.watched.append((origin, info.st_mtime_ns, info.st_size))

    def stale(self) -> str | None:
        """The first loaded file that changed or went away since the server loaded it."""
        for origin, mtime, size in self.watched:
            try:
                info = os.stat(origin)
            except OSError:
                return f"{origin} is gone"
            if (info.st_mtime_ns, info.st_size) != (mtime, size):
                return f"{origin} changed"
        return None

    def refusal(self, request: object) -> str | None:
        """Why this server cannot run ``request``, or None."""
        if not (isinstance(request, tuple) and len(request) == 8 and request[0] == PROTOCOL):
            return "another protocol"
        if request[1] != self.ident:
            return "another installation"
        if request[6] != self.mount_namespace:
            return "another mount namespace"
        return self.stale()


def serve(path: str, ident: str, idle: float) -> int:
    """Run a server on ``path`` until it has been idle for ``idle`` seconds, is stopped or goes stale.

    The server itself accepts no connection: one child forked ahead (the spare) waits for the next command,
    so that neither the fork nor the child's setup is on the command's way. A spare that takes a connection
    tells the server, which forks the next one when that command has ended, or at once when another client
    waits (within ``NEXT_SPARE_S`` in any case); a command that comes meanwhile waits in the listen queue.
    Each spare holds the read end of a pipe whose only writer is the server, so it ends with the server
    however that ends (its socket then refuses or is gone: clients run their commands by themselves).
    """
    import fcntl
    import gc
    import select
    import signal
    import time

    private_dir(os.path.dirname(path))
    lock = open(path.removesuffix(".sock") + ".lock", "a+")  # noqa: SIM115 (held for the server's life)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another server for this installation is starting or running
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    server = _Server(path, ident)
    server.load()
    gc.collect()
    gc.freeze()  # the children share the loaded modules' pages instead of touching them

    def stop(_signum: int, _frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound = None
    alive = os.pipe()  # the server holds the write end alone: EOF in a spare means the server is gone
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a crashed server's socket (we hold the lock, so no live server owns it)
        listener.bind(path)
        os.chmod(path, 0o600)
        bound = os.stat(path).st_ino
        listener.listen(128)
        listener.setblocking(False)  # the spare waits in select, which also watches for the server's end
        while True:
            # the spare writes a byte when it took a connection, and holds the pipe until it ends
            taken, tell = os.pipe()
            try:
                if os.fork() == 0:
                    os.close(taken)
                    _in_spare(_Spare(listener, lock, alive, tell, os.getppid()), server)
            except OSError:  # no process to be had now (a limit): clients run by themselves meanwhile
                os.close(taken)
                time.sleep(0.1)
                continue
            finally:
                os.close(tell)
            try:
                ready, _, _ = select.select([taken], [], [], idle)
                if not ready:
                    return 0  # idle: the spare ends with the server
                if os.read(taken, 1):
                    # the next spare once this command ended, or another client waits, or after a while: a
                    # fork at once would take a CPU from the command that has just started
                    select.select([taken, listener.fileno()], [], [], NEXT_SPARE_S)
                else:
                    time.sleep(0.1)  # it ended without a command (killed): no fork loop if that repeats
            finally:
                os.close(taken)
    finally:
        listener.close()
        try:
            if bound is not None and os.stat(path).st_ino == bound:
                os.unlink(path)
        except OSError:
            pass


class _Spare:
    """What a spare child holds of the server's: to close, or to wait on."""

    def __init__(
        self, listener: socket.socket, lock: IO[str], alive: tuple[int, int], tell: int, server_pid: int
    ) -> None:
        self.listener = listener
        self.lock = lock
        self.alive = alive
        self.tell = tell
        self.server_pid = server_pid


def _in_spare(spare: _Spare, server: _Server) -> NoReturn:
    """A spare child's life: never back into the server's loop (whose cleanup would remove its socket)."""
    status = 1
    try:
        spare.lock.close()  # a child outliving the server must not keep the next one from starting
        os.close(spare.alive[1])
        cmdchild.prepare()
        conn = _accept(spare)
        if conn is None:
            status = 0
        else:
            os.write(spare.tell, b".")  # and it stays open until this process ends (see serve)
            status = cmdchild.run_request(conn, server.refusal, spare.server_pid)
    except BaseException:  # reported, and the child ends all the same
        try:
            import traceback

            traceback.print_exc()
        except BaseException:  # stderr may be gone
            pass
    finally:
        os._exit(status)


def _accept(spare: _Spare) -> socket.socket | None:
    """The next connection of this user (closing the listener then), or None once the server is gone."""
    import select

    while True:
        ready, _, _ = select.select([spare.listener.fileno(), spare.alive[0]], [], [])
        if spare.alive[0] in ready:
            return None
        try:
            conn, _ = spare.listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            continue  # taken by no one after all, or gone before we took it
        if peer_uid(conn) == os.getuid():
            spare.listener.close()
            os.close(spare.alive[0])
            return conn
        conn.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m corral.cli.cmdserver SOCKET IDENTITY-IN-HEX``: what ``start_server`` runs."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m corral.cli.cmdserver SOCKET IDENTITY-IN-HEX", file=sys.stderr)
        return 2
    idle = float(os.environ.get("CORRAL_CMD_SERVER_IDLE") or DEFAULT_IDLE)
    return serve(args[0], bytes.fromhex(args[1]).decode(), idle)


if __name__ == "__main__":
    raise SystemExit(main())
