"""How the scheduler reads the log: each entry decoded as its fold needs it, and the bulk replay of a rebuild.

- The fold keeps submissions without their script and environment (``fold.slim_spec``), so the scheduler
  decodes entries with the slim decoder (``schemas/slim.py``). Its verdict holds on every path, so that a
  rebuild and the live fold agree entry for entry: an entry is folded if the slim decoder accepts it (or,
  for an entry with a key named like the slim spec's skipped ones, the full one does), and skipped and
  dead-lettered if neither does. The live path reads entries through ``Bus.read``, decoded in full (a
  launch order needs a recent submission's script), and gives one the full decoder refused to the slim one
  (``slim_verdict``); a rebuild decodes slim, and gives one the slim decoder refused to the full one
  (``rebuilt_entry``).
- A rebuild replays what the log held when it started with the bulk reader (``log_reader.BulkReader``: a
  pull consumer, large batches, no callback per entry), folding each batch in one loop (``fold_batch``), and
  reads the rest with ``Bus.read`` as before (also all of it, if the bulk read cannot go on).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from corral.libs.core.fold import apply
from corral.libs.core.state import State
from corral.libs.runtime.bus import LogEntry
from corral.libs.runtime.log_reader import BulkReader, RawEntry
from corral.libs.runtime.ports import decode_entry
from corral.schemas.codec import MAX_MESSAGE_BYTES, decode_slim_envelope, slim_decode
from corral.schemas.subjects import event_subject

#: Where the entries a fold handler failed on go, with the error (``Scheduler.poison``).
Poisoned = Callable[[LogEntry, str], None]


def rebuilt_entry(seq: int, subject: str, data: bytes) -> LogEntry:
    """An entry as the scheduler folds it: decoded slim, else in full, else refused (with the full
    decoder's reason, as the live path gives it)."""
    slim = decode_entry(seq, subject, data, decode=decode_slim_envelope)
    if slim.envelope is not None:
        return slim
    return decode_entry(seq, subject, data)


def slim_verdict(entry: LogEntry) -> LogEntry:
    """An entry of the live path (decoded in full) with the slim decoder's verdict: one the full decoder
    refused, decoded slim if that decoder accepts it."""
    if entry.envelope is not None or not entry.data:
        return entry
    slim = decode_entry(entry.seq, entry.subject, entry.data, entry.pending, decode=decode_slim_envelope)
    return entry if slim.envelope is None else slim


async def replay(
    reader: BulkReader,
    state: State,
    to_seq: int,
    fold_entry: Callable[[LogEntry], None],
    poisoned: Poisoned,
) -> int:
    """Fold the entries after ``state.last_seq`` up to ``to_seq`` read in bulk (``fold_batch``); how many it
    folded. ``log_reader.BulkReadError`` if the bulk read stops early: the state holds every entry up to
    where it stopped."""
    folded = 0
    async for batch in reader.read(state.last_seq + 1, to_seq):
        fold_batch(state, batch, fold_entry, poisoned)
        folded += len(batch)
    return folded


def fold_batch(
    state: State, batch: list[RawEntry], fold_entry: Callable[[LogEntry], None], poisoned: Poisoned
) -> None:
    """Fold one batch of the bulk reader's entries.

    An entry that decodes (slim) on its own subject is applied here; any other goes to ``fold_entry`` as a
    ``LogEntry`` (the decoders' verdict, the skip: ``rebuilt_entry``), as do the entries of the live path.
    A fold handler's failure goes to ``poisoned``."""
    # (The common entry costs a few microseconds: the loop calls the decoder and the subject rule itself,
    # and leaves every refusal, with its reason, to ``rebuilt_entry``.)
    for seq, subject, data in batch:
        try:
            env = slim_decode(data) if len(data) <= MAX_MESSAGE_BYTES else None
        except msgspec.DecodeError:
            env = None
        # A body on another subject than its own is refused (``ports.misplaced``): every log subject is
        # one ``event_subject`` names.
        if env is None or event_subject(env.body) != subject:
            fold_entry(rebuilt_entry(seq, subject, bytes(data)))
            continue
        outcome = apply(state, seq, env)
        if outcome.reason == "handler_failed":
            poisoned(
                LogEntry(seq=seq, subject=subject, envelope=env), f"a fold handler failed: {outcome.error}"
            )
