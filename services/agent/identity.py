"""Who a job runs as on this node: its owner's Unix identity (Slurm's slurmd looks the user up the same way).

The owner is the job's ``user``, the authenticated submitter the gateway recorded in ``JobSubmitted`` (the
API subject's last token, never the request body). The agent finds them in the node's user database
(``pwd``, ``os.getgrouplist``) at each launch, on each node: a job's processes get the user's uid, gid and
supplementary groups, and their login basics (``HOME``, ``USER``, ``LOGNAME``, ``SHELL``).

- An agent run by root runs every job as its owner (the supervisor drops to it between fork and exec:
  ``stepd.py``). A job of uid 0 (root, or another name of it) runs only where ``[cluster] allow_root_jobs``
  says so: the gateway refuses root's submission, this is the node's own check.
- An agent that is not root can run jobs only as itself: a job of its own user runs as today, any other
  fails to launch saying why (a single-user local cluster, where everyone is the agent's user, works).
- A user the node does not know fails to launch (Slurm's "Invalid user id"): nothing runs, as root or
  anyone else.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass

from corral.services.agent.stepdir import RunAs


class UnknownIdentity(Exception):
    """The job cannot run as its owner here; the message is the job's Reason."""


@dataclass(frozen=True)
class JobUser:
    """A job owner as this node knows them."""

    name: str  # login name
    uid: int  # user id
    gid: int  # primary group id
    groups: tuple[int, ...]  # every group they are in (primary included), as initgroups sets them
    home: str  # home directory (HOME)
    shell: str  # login shell (SHELL)
    switch: bool  # the agent runs as root: the job's processes change to this identity

    def run_as(self) -> RunAs | None:
        """What the supervisor switches to (None: the agent's own identity, which is the job's)."""
        return RunAs(uid=self.uid, gid=self.gid, groups=list(self.groups)) if self.switch else None

    def login(self) -> dict[str, str]:
        """The login basics of the job's environment."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name, "SHELL": self.shell}


@dataclass(frozen=True)
class Identities:
    """Looks job owners up on this node."""

    node: str  # this node (for the messages)
    allow_root_jobs: bool  # ``[cluster] allow_root_jobs``
    agent_uid: int = -1  # the agent's uid (-1: this process's)

    def of(self, name: str) -> JobUser:
        """The job owner ``name`` as the job will run; UnknownIdentity says why it cannot."""
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise UnknownIdentity(f"Invalid user id: user {name} does not exist on {self.node}") from None
        if entry.pw_uid == 0 and not self.allow_root_jobs:
            raise UnknownIdentity(
                f"Invalid user id: {name} is uid 0 and [cluster] allow_root_jobs is false: "
                "jobs may not run as root"
            )
        agent = os.getuid() if self.agent_uid < 0 else self.agent_uid
        if agent != 0 and entry.pw_uid != agent:
            me = _name_of(agent)
            raise UnknownIdentity(
                f"cannot run a job of {name} on {self.node}: its agent runs as {me}, not root, and can run "
                f"jobs only as {me}"
            )
        return JobUser(
            name=entry.pw_name,
            uid=entry.pw_uid,
            gid=entry.pw_gid,
            groups=tuple(os.getgrouplist(entry.pw_name, entry.pw_gid)),
            home=entry.pw_dir,
            shell=entry.pw_shell or "/bin/sh",
            switch=agent == 0,
        )


def _name_of(uid: int) -> str:
    """A uid's name, else the number."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
