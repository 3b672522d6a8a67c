"""Corral's contract: the events of the log, the API messages, the subjects and the codec.

Every state-changing fact is one ``Envelope(meta, body)`` appended to one JetStream stream
(``CORRAL_EVENTS``), so the scheduler's fold sees one total order of job and node events.

Job lifecycle (``squeue``/``sacct`` states)::

                     JobSubmitted
                          |
                          v
       +------------- PENDING <--------------------------------+
       | cancel    (reason: Priority, Resources, ...)          | JobRequeued (restart + 1):
       |                  | JobAllocated(attempt n)            |  node failure, scontrol requeue
       |                  v                                    |
       |              RUNNING ---------------------------------+
       |   run exits / is killed |
       v                         v
    CANCELLED   COMPLETED . FAILED . TIMEOUT . CANCELLED . NODE_FAIL . OUT_OF_MEMORY

Who writes what (one writer per kind of event keeps replay deterministic):

- the gateway appends intents: ``JobSubmitted``, ``JobCancelRequested``;
- the scheduler appends decisions and conclusions: ``JobAllocated``, ``JobRequeued``,
  ``JobCompleted``, ``JobFailed``, ``JobCancelled``, ``JobNodeFailed``;
- an agent appends facts about runs on its own node: ``NodeRegistered``, ``RunStarted``,
  ``RunExited``;
- health appends node facts: ``NodeDown``, ``NodeUp``.

A *run* (attempt) is one allocation of a job, numbered from 0 (= ``SLURM_RESTART_COUNT``); every
run fact carries (job id, attempt) and a fact for an older attempt changes nothing.

Node lifecycle::

    NodeRegistered --> UP (idle / mixed / allocated, derived) --NodeDown(reason)--> DOWN --NodeUp--> UP

Heartbeats are not events; only state changes are.

Evolution: fields are only ever added at the end with defaults; a tag is never reused or given a
new meaning (retired tags are listed in ``events.RETIRED_TAGS``).
"""
