"""Memory cgroups of runs (Slurm's task/cgroup with ConstrainRAMSpace): cgroup v1 and v2, stdlib only.

Each run gets a cgroup of its own under ``<memory hierarchy>/<cgroup_root>/``, named
``<tag>_<node>_<job>.<attempt>`` (``run_name``; the tag names the cluster and the agent's state directory, so
clusters on one machine never share a cgroup). The agent creates it with the run's memory limit
(``Confinement.create``), the job's first process joins it between fork and exec (``join_self``), and
whoever sees the run end removes it (``remove``: kill what is left in it, then rmdir).

The two versions differ only in where things are:

======================  ================================  ==================================
what                    v1 (``memory`` controller mount)  v2 (unified mount)
======================  ================================  ==================================
the limit               ``memory.limit_in_bytes``         ``memory.max``
OOM kills so far        ``memory.oom_control`` oom_kill   ``memory.events`` oom_kill
peak usage              ``memory.max_usage_in_bytes``     ``memory.peak`` (Linux 5.19+)
======================  ================================  ==================================

v2's rules: a cgroup with children that use a controller holds no processes itself (the root excepted), and
a controller reaches a child only when every ancestor lists it in ``cgroup.subtree_control``. So the root
directory never gets a process and ``probe`` enables ``+memory`` down to it; if an ancestor refuses (it has
processes of its own: EBUSY), v2 confinement is not usable.

The supervisor is run with ``python -I`` by file path and loads this file by path too: it must stay
stdlib-only and import nothing of corral.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time

V1 = "v1"
V2 = "v2"
#: Slurm's MinRAMSpace default: no run is confined below this (its shell and loader need some room).
MIN_RAM_SPACE_MB = 30
#: The file listing a cgroup's processes (both versions); writing a pid (0: the writer) moves it there.
PROCS = "cgroup.procs"
#: How long ``remove`` keeps killing and retrying rmdir before giving up.
REMOVE_TIMEOUT_S = 5.0

_LIMIT = {V1: "memory.limit_in_bytes", V2: "memory.max"}
_OOM = {V1: "memory.oom_control", V2: "memory.events"}
_PEAK = {V1: "memory.max_usage_in_bytes", V2: "memory.peak"}


class CgroupError(Exception):
    """A cgroup could not be set up; the message says why (for the agent's log)."""


# pure parts ------------------------------------------------------------------------------------------
def oom_kills(text: str) -> int:
    """The ``oom_kill`` count of a v1 ``memory.oom_control`` or v2 ``memory.events`` file (0 if absent)."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


def parse_bytes(text: str) -> int | None:
    """A byte count file (``memory.peak``, ``memory.max_usage_in_bytes``); None if it holds no number."""
    text = text.strip()
    return int(text) if text.isdigit() else None


def memory_mounts(mounts_text: str) -> tuple[str | None, str | None]:
    """(v1 mount point with the ``memory`` controller, v2 mount point) from ``/proc/self/mounts``."""
    v1 = v2 = None
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        _, mount, fstype, options = fields[:4]
        if fstype == "cgroup" and "memory" in options.split(",") and v1 is None:
            v1 = mount
        elif fstype == "cgroup2" and v2 is None:
            v2 = mount
    return v1, v2


def cluster_tag(cluster: str, state_dir: str) -> str:
    """The prefix of one agent's cgroups: its cluster's name and a hash of its state directory (two clusters
    on one machine, both called ``local`` with a ``node1``, must not meet)."""
    import hashlib  # here: the run's supervisor, which loads this module, never needs it

    digest = hashlib.sha256(os.path.abspath(state_dir).encode()).hexdigest()[:10]
    return f"{cluster}-{digest}"


def run_name(tag: str, node: str, job_id: int, attempt: int) -> str:
    """The cgroup directory name of a run: ``<tag>_<node>_<job>.<attempt>``."""
    return f"{tag}_{node}_{job_id}.{attempt}"


def limit_bytes(mem_mb: int) -> int:
    """The cgroup limit for ``mem_mb`` MiB, never below MIN_RAM_SPACE_MB."""
    return max(mem_mb, MIN_RAM_SPACE_MB) * 1024 * 1024


# the files of one run's cgroup ---------------------------------------------------------------------------
def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def version_of(cgroup: str) -> str:
    """v1 or v2, from the files of a cgroup directory."""
    return V2 if os.path.exists(os.path.join(cgroup, "cgroup.controllers")) else V1


def oom_count(cgroup: str) -> int | None:
    """OOM kills in the cgroup so far; None if it cannot be read (gone, no memory controller)."""
    text = _read(os.path.join(cgroup, _OOM[version_of(cgroup)]))
    return None if text is None else oom_kills(text)


def peak_bytes(cgroup: str) -> int | None:
    """The cgroup's peak memory usage in bytes (Slurm's MaxRSS of the run); None if unknown."""
    text = _read(os.path.join(cgroup, _PEAK[version_of(cgroup)]))
    return None if text is None else parse_bytes(text)


def members(cgroup: str) -> list[int]:
    """Pids of the processes in the cgroup (empty if it is gone)."""
    text = _read(os.path.join(cgroup, PROCS)) or ""
    return [int(x) for x in text.split() if x.isdigit()]


def open_procs(cgroup: str) -> int:
    """A descriptor on the cgroup's ``cgroup.procs``, opened before a fork so the child only writes to it."""
    return os.open(os.path.join(cgroup, PROCS), os.O_WRONLY | os.O_CLOEXEC)


def join_self(procs_fd: int) -> None:
    """Move the calling process into the cgroup of ``procs_fd``: a ``preexec_fn``, between fork and exec, so
    the job's first instruction is already confined. Raises OSError if it cannot (Popen then raises
    SubprocessError and the caller starts it again unconfined: a job never fails for its cgroup)."""
    os.write(procs_fd, b"0")


def remove(cgroup: str, timeout: float = REMOVE_TIMEOUT_S) -> bool:
    """Kill every process left in the cgroup and remove it; True once it is gone (or never existed).

    Processes may fork while being killed and take a moment to exit, so both are retried until
    ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        for pid in members(cgroup):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        try:
            os.rmdir(cgroup)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                return False
        time.sleep(0.05)


# the hierarchy -----------------------------------------------------------------------------------------
class Confinement:
    """Where this node's run cgroups live: a writable directory under the memory controller's hierarchy.

    A plain class, not a dataclass: the run's supervisor loads this module on every launch, and
    ``dataclasses`` would pull ``inspect`` in (~10 ms per job start)."""

    __slots__ = ("root", "version")

    def __init__(self, version: str, root: str) -> None:
        self.version = version  # V1 or V2
        self.root = root  # absolute path of the directory holding the run cgroups

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Confinement) and (self.version, self.root) == (other.version, other.root)

    def __hash__(self) -> int:
        return hash((self.version, self.root))

    def __repr__(self) -> str:
        return f"Confinement({self.version!r}, {self.root!r})"

    def path(self, name: str) -> str:
        """The absolute path of a run cgroup called ``name``."""
        return os.path.join(self.root, name)

    def create(self, name: str, limit: int) -> str:
        """Create a run's cgroup with a memory limit of ``limit`` bytes; its path. CgroupError says why not.

        A cgroup left by an earlier try of the same run is emptied and reused."""
        path = self.path(name)
        try:
            os.mkdir(path)
        except FileExistsError:
            for pid in members(path):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        except OSError as exc:
            raise CgroupError(f"cannot create {path}: {exc.strerror}") from None
        try:
            _write(os.path.join(path, _LIMIT[self.version]), str(limit))
        except OSError as exc:
            remove(path, timeout=1.0)
            raise CgroupError(f"cannot set the memory limit of {path}: {exc.strerror}") from None
        return path

    def children(self, prefix: str) -> list[str]:
        """Paths of the run cgroups whose names start with ``prefix``."""
        try:
            names = os.listdir(self.root)
        except OSError:
            return []
        return [self.path(n) for n in sorted(names) if n.startswith(prefix) and os.path.isdir(self.path(n))]


def _enable_memory_down_to(mount: str, root: str) -> None:
    """v2: list ``memory`` in ``cgroup.subtree_control`` of every cgroup from the mount down to ``root``
    (root included), creating ``root``'s directories on the way."""
    current = mount
    parts = [p for p in os.path.relpath(root, mount).split(os.sep) if p not in ("", ".")]
    for part in [*parts, None]:
        control = os.path.join(current, "cgroup.subtree_control")
        if "memory" not in (_read(control) or "").split():
            _write(control, "+memory")
        if part is None:
            return
        current = os.path.join(current, part)
        with contextlib.suppress(FileExistsError):
            os.mkdir(current)


def probe(cgroup_root: str, mounts_text: str | None = None) -> tuple[Confinement | None, str]:
    """This node's confinement under ``cgroup_root`` (relative to the memory hierarchy), or None and why not.

    v1 is used where its ``memory`` controller is mounted, else v2 where the unified hierarchy offers the
    ``memory`` controller. Nothing is usable when neither is, or when the directory cannot be made ready
    (not root, a read-only mount, a v2 ancestor that holds processes).
    """
    if mounts_text is None:
        mounts_text = _read("/proc/self/mounts") or ""
    v1, v2 = memory_mounts(mounts_text)
    if v1 is not None:
        root = os.path.join(v1, cgroup_root)
        try:
            os.makedirs(root, exist_ok=True)
        except OSError as exc:
            return None, f"cgroup v1 memory controller at {v1} is not usable: {exc.strerror}"
        if not os.access(os.path.join(root, PROCS), os.W_OK):
            return None, f"cgroup v1 memory controller at {v1} is not writable"
        return Confinement(V1, root), f"cgroup v1 memory controller at {v1}"
    if v2 is not None and "memory" in (_read(os.path.join(v2, "cgroup.controllers")) or "").split():
        root = os.path.join(v2, cgroup_root)
        try:
            _enable_memory_down_to(v2, root)
        except OSError as exc:
            return None, f"cgroup v2 at {v2}: cannot delegate the memory controller to {root}: {exc.strerror}"
        return Confinement(V2, root), f"cgroup v2 at {v2}"
    return None, "no memory cgroup controller is mounted"
