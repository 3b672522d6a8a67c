"""Each run's private TMPDIR on this node, as sites get from Slurm's job_container/tmpfs (its BasePath) or an
auto-tmpdir plugin: made by the agent before anything of the run starts here, the job owner's (0700), removed
once nothing of the run is left here; and what else the node adds to its jobs' environments
(``jobenv.NodeEnv``: the cluster's configuration file, the node's topology address).

Layout: ``<[cluster] tmpdir_base>/corral-<tag>-<node>/<job>.<attempt>/``. The agent's own directory (the tag
is the cluster's name and a hash of the agent's state directory, as its cgroups': two clusters on one
machine never meet) is made by the agent, 0711 (owners reach their own run's, nobody lists them), and
refused unless it is a directory of the agent's own that nobody else may write (in a shared ``/tmp`` a user
could make that name first). Its path is written to ``<agent state>/tmpdir`` for ``corral up``'s stop.

- The batch node makes a run's when it launches the script and removes it once the run ended there (its
  steps' tasks gone), before it reports the exit.
- Another node of the job makes it when the run's first step with tasks there starts, and removes it when
  the run's kill order ends the run there (every node of a run gets one when the run ends: the scheduler's
  orphans), before it reports the run gone. So steps of one run share it on each node, as in Slurm.
- A restarted agent removes the ones of runs it reported ended, or of attempts older than one it has seen.

Where it cannot be made the job gets ``/tmp`` (slurmstepd's fallback) and the agent says why in its log; a
job never fails to launch for want of one. ``tmpdir_base = ""`` turns it off (Slurm's default: the job's
own TMPDIR, else ``/tmp``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from corral.services.agent.identity import JobUser
from corral.services.agent.jobenv import SHARED_TMPDIR, NodeEnv
from corral.services.agent.records import Records, run_key

#: The agent state's file naming its directory of run TMPDIRs (for ``stop_all``).
MARKER = "tmpdir"


class RunTmp:
    """The run TMPDIRs of one node (``base`` None: none, the jobs keep their own TMPDIR)."""

    def __init__(
        self, base: Path | None, tag: str, node: str, records: Records, log: Any, env: NodeEnv | None = None
    ) -> None:
        self.root = None if base is None else base / f"corral-{tag}-{node}"  # this agent's directory
        self.records = records  # which runs ended here (no directory for them)
        self.log = log
        self.env = env or NodeEnv()  # the node's part of every job's environment, TMPDIR aside

    def path(self, job_id: int, attempt: int) -> Path | None:
        """Where the run's TMPDIR is here (None: none)."""
        return None if self.root is None else self.root / f"{job_id}.{attempt}"

    def node_env(self, job_id: int, attempt: int, owner: JobUser | None) -> NodeEnv:
        """What this node adds to the run's environment, its TMPDIR made first (blocking, briefly)."""
        if self.root is None:
            return self.env
        return dataclasses.replace(self.env, tmpdir=self.make(job_id, attempt, owner))

    def make(self, job_id: int, attempt: int, owner: JobUser | None) -> str:
        """The run's TMPDIR here, made if need be (the owner's, 0700); /tmp if it cannot be, or if the run
        already ended here."""
        path = self.path(job_id, attempt)
        record = self.records.get(job_id, attempt)
        if path is None or (record is not None and record.exited):
            return SHARED_TMPDIR
        try:
            self._own_root()
            made = True
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                made = False  # the run's, made by its launch or an earlier step here
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                uid = os.fstat(fd).st_uid
                if owner is not None and owner.switch and uid != owner.uid:
                    os.fchown(fd, owner.uid, owner.gid)
                    made = True  # (an agent stopped between making it and handing it over)
                if made:
                    os.fchmod(fd, 0o700)
            finally:
                os.close(fd)
        except OSError as exc:
            self.log.warning("run has no private TMPDIR: it gets /tmp", job_id=job_id, error=str(exc))
            return SHARED_TMPDIR
        return str(path)

    def _own_root(self) -> None:
        """Make this agent's directory, or check that the one there is its own and closed to others."""
        assert self.root is not None
        self.root.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.root, 0o711)
        info = os.lstat(self.root)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            raise OSError(errno.EPERM, f"{self.root} is not a directory of the agent's own, closed to others")
        os.chmod(self.root, 0o711)  # its own umask made it

    def remove(self, job_id: int, attempt: int) -> None:
        """Remove the run's TMPDIR here, with what the job left in it (blocking)."""
        path = self.path(job_id, attempt)
        if path is None or not os.path.lexists(path):
            return
        # fd-based on Linux (shutil.rmtree.avoids_symlink_attacks): a link the job made is removed, not
        # followed; a directory the job closed to itself is opened up (an agent that is not root)
        shutil.rmtree(path, onerror=_open_up)
        if os.path.lexists(path):
            self.log.warning("run TMPDIR not removed", job_id=job_id, path=str(path))

    def sweep(self, state_dir: Path) -> None:
        """At start: record this agent's directory (``MARKER``), and remove the TMPDIRs of runs reported
        ended here or older than an attempt seen since (left by an agent that died in between)."""
        if self.root is None:
            return
        with contextlib.suppress(OSError):
            (state_dir / MARKER).write_text(f"{self.root}\n")
        try:
            names = os.listdir(self.root)
        except OSError:
            return
        for name in names:
            if (key := run_key(name)) is None:
                continue
            job_id, attempt = key
            record = self.records.get(job_id, attempt)
            if (record is not None and record.exited) or self.records.latest_attempt(job_id) > attempt:
                self.remove(job_id, attempt)


def _open_up(function: Any, path: str, excinfo: Any) -> None:
    """rmtree's error handler, for an agent that is not root: give it every right on the directory at
    fault (the one that holds ``path`` for a removal, ``path`` for a listing) and try once more; what
    still fails stays (``remove`` says so)."""
    with contextlib.suppress(OSError):
        if function in (os.rmdir, os.unlink):
            os.chmod(os.path.dirname(path), 0o700)
            function(path)
        else:
            os.chmod(path, 0o700)
            shutil.rmtree(path, ignore_errors=True)


def remove_all(state_dir: Path) -> None:
    """Remove the agent's directory of run TMPDIRs that ``state_dir`` names (``corral up``'s stop, once the
    runs are killed)."""
    with contextlib.suppress(OSError):
        root = (state_dir / MARKER).read_text().strip()
        if root:
            shutil.rmtree(root, ignore_errors=True)
