"""Corral's contract: the events of the log, the API messages, the subjects and the codec.

Every state-changing fact is one ``Envelope(meta, body)`` appended to one JetStream stream
(``CORRAL_EVENTS``), so the scheduler's fold sees one total order of job and node events.

Job lifecycle (``squeue``/``sacct`` states)::

                     JobSubmitted
                          |
                          v
       +------------- PENDING <--------------------------------+
       | cancel    (reason: Priority, Resources, Dependency,   | JobRequeued (restart + 1):
       |            DependencyNeverSatisfied, JobHeldUser,     |
       |            JobHeldAdmin, BeginTime, ...)              |
       |                  | JobAllocated(attempt n)            |  node failure, scontrol requeue,
       |                  v                                    |  preemption in requeue mode
       |              RUNNING ---------------------------------+
       |   run exits / is killed |  (JobPreempted: kill order, the job stays RUNNING until the exit)
       v                         v
    CANCELLED   COMPLETED . FAILED . TIMEOUT . CANCELLED . NODE_FAIL . OUT_OF_MEMORY . PREEMPTED

Who writes what (one writer per kind of event keeps replay deterministic):

- the gateway appends intents: ``JobSubmitted``, ``JobCancelRequested``, ``JobHoldRequested``,
  ``JobReleaseRequested``, ``JobUpdateRequested``, ``JobRequeueRequested``, ``JobSignalRequested``; the
  admins' node requests ``NodeDrainRequested``, ``NodeResumeRequested``, ``NodeDownRequested``; and the
  reservation requests ``ReservationCreateRequested``, ``ReservationDeleteRequested``;
- the scheduler appends decisions and conclusions: ``JobAllocated``, ``JobRequeued``,
  ``JobCompleted``, ``JobFailed`` (a node failure is ``JobFailed(reason="NodeFail")``), ``JobCancelled``,
  ``JobHeld``, ``JobReleased``, ``JobUpdated``, ``JobPreempted``, ``JobReasonChanged`` (a pending job's
  reason changed: recorded, it moves nothing), and ``ReservationCreated``,
  ``ReservationRejected``, ``ReservationDeleted``;
- an agent appends facts about its own node and the runs on it: ``NodeRegistered``, ``RunStarted``,
  ``RunExited``, and (the batch node's agent) ``StepStarted``, ``StepExited``;
- health appends node facts: ``NodeDown``, ``NodeUp``, and answers the gateway's admin intents
  ``NodeDrainRequested``/``NodeResumeRequested``/``NodeDownRequested`` with
  ``NodeDrained``/``NodeResumed``/``NodeDown(by=admin)``.

``lifecycle.WRITERS`` holds the same as data.

A *run* (attempt) is one allocation of a job, numbered from 0 (= ``SLURM_RESTART_COUNT``); every
run fact carries (job id, attempt) and a fact for an older attempt changes nothing.

A pending job is only placed when it is *eligible*: not held (``JobSpec.held`` at submit, or
``JobHeld`` until ``JobReleased``), its ``JobSpec.dependencies`` met (after, afterok, afternotok,
afterany, singleton; all of them, or any one), and its ``JobSpec.begin_time`` come. Otherwise its
reason says which, in that order; a dependency that can never be met leaves the job pending with
``DependencyNeverSatisfied``. A hold, release or update request (intent) of a job that is no longer
pending changes nothing; the scheduler's ``JobHeld``/``JobReleased``/``JobUpdated`` decide.

Node lifecycle::

    NodeRegistered --> UP (idle / mixed / allocated, derived) --NodeDown(reason)--> DOWN --NodeUp--> UP
                        |  NodeDrained (admin: scontrol update State=DRAIN Reason=...)
                        |  or NodeRegistered(drain_reason) (GPU count mismatch)
                        v
                     DRAINING (running jobs finish, nothing new) --last job ends--> DRAINED
                        |                                                            |
                        +--------------- NodeResumed (State=RESUME) -----------------+--> UP

An admin drain and a registration drain are separate: a re-registration (agent restart) sets or clears
only the registration's; ``NodeResumed`` clears both (a GPU mismatch drains again at the next
registration). A down node may be drained too (it shows ``DOWN+DRAIN``).

Heartbeats are not events; only state changes are.

Both machines are also data, in ``lifecycle``: the states, the transitions and which event moves which,
and who writes each event. The fold, accounting, the gateway's phase guess and the simulator are tested
against those tables.

Evolution: fields are only ever added at the end with defaults; a tag is never reused or given a
new meaning (retired tags are listed in ``events.RETIRED_TAGS``).
"""
