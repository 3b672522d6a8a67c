"""The ``history`` verb (``corral audit``): a job's, a node's or a user's entries of the log, read-only.

Which entries a history holds (read with one filtered pass, ``EventLog.entries``):

- a job: every entry on its subjects (``corral.evt.job.<id>.>``) and its steps' facts
  (``corral.evt.step.<id>.>``); an array task also gets its array's submission and the whole-array cancels,
  which are on the array's id (the task has no submission of its own). A task is named by its own job id
  or as ``A_T`` (``array_task``: resolved by ``JobLookup.task``, as ``scancel A_T`` is); an array's id
  ``A`` names the job with that id, the array's first task. The reply's ``job_id`` is the job's own id;
- a node: its own events (``corral.evt.node.<node>.>``), the allocations that name it, and the run and step
  facts its agent reported;
- a user: every entry of the jobs the user submitted (their ids from the submissions, in log order, since a
  submission always comes before its job's other entries).

Who may read which (DESIGN §8; the caller comes from the request subject, never from the body): a user their
own jobs' history and their own user history; the auditor role (read-only) and admins every history,
nodes' included. Anything else is refused with the job and the rule named.

A reply holds at most the request's ``limit`` entries, the newest, and stays under ``MAX_REPLY_BYTES``
(submissions carry whole scripts); ``truncated`` says that older entries were left out.

Its ``causes`` are the entries outside the history that its entries name as their cause
(``Meta.causation_id``), two steps back, so that ``corral audit`` can say why: the ``NodeDown`` of a node the
job ran on (and the admin's request it answered), the preemptor's submission. They are looked for where such
a cause can be (the events of the nodes an allocation names, the jobs an entry names, the preemptor's),
with scripts and environments left out: they may be another user's.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from corral.libs.runtime.errors import Forbidden, InvalidInput, NotFound
from corral.libs.runtime.ports import EventLog, LogEntry
from corral.libs.slurm.array import array_indices
from corral.schemas import api, subjects
from corral.schemas import events as ev
from corral.schemas.api_requests import MAX_HISTORY
from corral.schemas.codec import MAX_REPLY_BYTES, encode
from corral.services.gateway.lookup import Found, JobLookup

#: The rule a refusal names.
RULE = "a user may read only their own jobs' history; the auditor and admin roles may read every history"

#: How many steps back the causes outside the history are looked for.
CAUSE_DEPTH = 2
#: At most this many subjects are read for them.
MAX_CAUSE_SUBJECTS = 64

#: Decides whether one entry of the filtered read belongs to the history.
Keep = Callable[[LogEntry], bool]


def _everything(entry: LogEntry) -> bool:
    return True


@dataclass(frozen=True)
class Reading:
    """What one history reads: the subjects, which of their entries are decoded at all (``wanted``, by
    subject; None: every one), and which of those belong to it (``keep``)."""

    filters: list[str]
    keep: Keep = _everything
    wanted: Callable[[str], bool] | None = None
    by_subject: bool = False  # ``wanted`` alone says which entries belong: count them, decode the newest


class History:
    """Reads histories from the log for the callers allowed to see them."""

    def __init__(
        self, events: EventLog, lookup: JobLookup, admins: frozenset[str], auditors: frozenset[str]
    ) -> None:
        self.events = events
        self.lookup = lookup
        self.readers = admins | auditors  # who may read every history

    async def history(self, user: str, req: api.HistoryRequest) -> api.HistoryReply:
        """The entries the request names, if the caller may read them (Forbidden naming the rule if not)."""
        if [req.job_id, req.node, req.user].count(None) != 2:
            raise InvalidInput("give exactly one of a job id, --node NAME and --user NAME", field="job_id")
        if not 1 <= req.limit <= MAX_HISTORY:
            raise InvalidInput(f"limit must be 1-{MAX_HISTORY}, not {req.limit}", field="limit")
        job_id = None
        if req.job_id is not None:
            found = await self._job(req.job_id, req.array_task)
            job_id = found.job_id
            reading = self._of_job(user, found)
        elif req.array_task is not None:
            raise InvalidInput("an array task index needs the array's job id", field="array_task")
        elif req.node is not None:
            reading = self._of_node(user, req.node)
        else:
            assert req.user is not None
            reading = await self._of_user(user, req.user)
        reply = await self._read(reading, req.limit)
        causes = await self._causes(reply.entries, set(reading.filters))
        return msgspec.structs.replace(reply, causes=causes, job_id=job_id)

    async def _job(self, job_id: int, array_task: int | None) -> Found:
        """The job ``job_id`` names, or task ``job_id_array_task`` (``A_T``); NotFound naming it if none."""
        if array_task is None:
            found = await self.lookup.find(job_id)
        elif array_task < 0:
            raise InvalidInput(f"array task index must be 0 or more, not {array_task}", field="array_task")
        else:
            found = await self.lookup.task(job_id, array_task)
        if found is None:
            named = job_id if array_task is None else f"{job_id}_{array_task}"
            raise NotFound(f"Invalid job id specified: no job {named}")
        return found

    def _of_job(self, user: str, found: Found) -> Reading:
        job_id = found.job_id
        if found.user != user and user not in self.readers:
            raise Forbidden(
                f"Access/permission denied: job {job_id} belongs to {found.user}, not {user}: {RULE}"
            )
        filters = [subjects.job_events(job_id), subjects.step_events(job_id)]
        array_id = found.submitted.job_id
        if array_id == job_id:
            return Reading(filters)
        filters += [
            subjects.job_subject(array_id, "job_submitted"),
            subjects.job_subject(array_id, "job_cancel_requested"),
        ]
        return Reading(filters, lambda entry: _of_task(entry, job_id, found))

    def _of_node(self, user: str, node: str) -> Reading:
        if not subjects.valid_token(node):
            raise InvalidInput(f"node name {node!r} is not a valid name", field="node")
        if user not in self.readers:
            raise Forbidden(
                f"Access/permission denied: node {node}'s history holds every user's jobs: only the "
                "auditor and admin roles may read it"
            )
        filters = [
            subjects.node_events(node),
            subjects.job_subject("*", "job_allocated"),
            subjects.job_subject("*", "*", node),  # run facts reported by the node's agent
            f"corral.evt.step.*.*.{node}",  # step facts reported by it
        ]

        def names_node(entry: LogEntry) -> bool:
            body = entry.envelope.body if entry.envelope is not None else None
            if isinstance(body, ev.JobAllocated):
                return any(a.node == node for a in body.allocations)
            return True

        return Reading(filters, names_node)

    async def _of_user(self, user: str, owner: str) -> Reading:
        """The submissions read first (without scripts) for the owner's job ids; the reading then takes the
        entries on those jobs' subjects, the others' skipped by their subject alone, undecoded (``_read``)."""
        if not subjects.valid_token(owner):
            raise InvalidInput(f"user name {owner!r} is not a valid name", field="user")
        if owner != user and user not in self.readers:
            raise Forbidden(f"Access/permission denied: the jobs of {owner} are not {user}'s: {RULE}")
        jobs: set[str] = set()  # their ids as their subjects spell them
        async for entry in self.events.entries([subjects.job_subject("*", "job_submitted")], slim=True):
            body = entry.envelope.body if entry.envelope is not None else None
            if isinstance(body, ev.JobSubmitted) and body.user == owner:
                count = 1 if body.spec.array is None else len(array_indices(body.spec.array))
                jobs.update(str(job_id) for job_id in range(body.job_id, body.job_id + count))

        def owned(subject: str) -> bool:  # corral.evt.job.<id>.… and corral.evt.step.<id>.…
            return subject.split(".", 4)[3] in jobs

        return Reading(["corral.evt.job.>", "corral.evt.step.>"], wanted=owned, by_subject=True)

    async def _read(self, reading: Reading, limit: int) -> api.HistoryReply:
        """The newest ``limit`` kept entries within the reply's size, oldest first."""
        newest: collections.deque[api.HistoryEntry] = collections.deque(maxlen=limit)
        kept = 0
        wanted = reading.wanted
        if reading.by_subject and wanted is not None:
            wanted, kept = await self._newest(reading.filters, wanted, limit)
        async for entry in self.events.entries(reading.filters, wanted):
            # An entry that fails to decode has nothing to show (the fold skips it too).
            if entry.envelope is not None and reading.keep(entry):
                kept += 1
                newest.append(api.HistoryEntry(seq=entry.seq, envelope=entry.envelope))
        chosen: list[api.HistoryEntry] = []
        size = 0
        for item in reversed(newest):
            size += len(encode(item))
            if size > MAX_REPLY_BYTES:
                break
            chosen.append(item)
        chosen.reverse()
        return api.HistoryReply(entries=chosen, truncated=len(chosen) < kept)

    async def _newest(
        self, filters: list[str], wanted: Callable[[str], bool], limit: int
    ) -> tuple[Callable[[str], bool], int]:
        """Where ``wanted`` alone says which entries belong (a user's history: thousands of them, most of
        every job's, each a full decode): a first read counts them undecoded; the second then decodes only
        the newest ``limit`` (what was appended in between comes after those, the deque keeps the newest).
        The predicate of the second read, and how many older ones it leaves out."""
        total = 0

        def counted(subject: str) -> bool:
            nonlocal total
            total += wanted(subject)
            return False

        async for _ in self.events.entries(filters, counted):
            pass
        older = max(0, total - limit)
        ahead = older

        def newest(subject: str) -> bool:
            nonlocal ahead
            if not wanted(subject):
                return False
            ahead -= 1
            return ahead < 0

        return newest, older

    async def _causes(self, entries: list[api.HistoryEntry], read: set[str]) -> list[api.HistoryEntry]:
        """The entries outside ``entries`` that they name as causes, ``CAUSE_DEPTH`` steps back."""
        known = {e.envelope.meta.event_id for e in entries}
        found: list[api.HistoryEntry] = []
        frontier = entries
        for _ in range(CAUSE_DEPTH):
            wanted = {
                c for e in frontier if (c := e.envelope.meta.causation_id) is not None and c not in known
            }
            where = sorted(_where_causes_are(frontier) - read)[:MAX_CAUSE_SUBJECTS]
            if not wanted or not where:
                break
            frontier = [
                api.HistoryEntry(seq=entry.seq, envelope=_without_script(entry.envelope))
                async for entry in self.events.entries(where)
                if entry.envelope is not None and entry.envelope.meta.event_id in wanted
            ]
            known.update(e.envelope.meta.event_id for e in frontier)
            found += frontier
        return sorted(found, key=lambda e: e.seq)


def _where_causes_are(entries: list[api.HistoryEntry]) -> set[str]:
    """The subjects the causes of ``entries`` may be on: the nodes and jobs they name."""
    out: set[str] = set()
    for entry in entries:
        body = entry.envelope.body
        if isinstance(body, ev.JobAllocated):
            out.update(subjects.node_events(a.node) for a in body.allocations)
        if isinstance(body, ev.JobPreempted):
            out.add(subjects.job_events(body.by_job))
        if isinstance(body, ev.NODE_EVENTS):
            out.add(subjects.node_events(body.node))
        elif not isinstance(body, ev.RESERVATION_EVENTS):
            out.add(subjects.job_events(body.job_id))
    return out


def _without_script(envelope: ev.Envelope) -> ev.Envelope:
    """A submission without its script and environment (another user's may be shown as a cause)."""
    body = envelope.body
    if not isinstance(body, ev.JobSubmitted):
        return envelope
    spec = msgspec.structs.replace(body.spec, script="", environment={})
    return msgspec.structs.replace(envelope, body=msgspec.structs.replace(body, spec=spec))


def _of_task(entry: LogEntry, job_id: int, found: Found) -> bool:
    """An entry of a task's filtered read: its own, its array's submission, a whole-array cancel."""
    body = entry.envelope.body if entry.envelope is not None else None
    if isinstance(body, ev.JobSubmitted):
        return body.job_id == found.submitted.job_id
    if isinstance(body, ev.JobCancelRequested) and body.job_id != job_id:
        return body.whole_array
    return True
