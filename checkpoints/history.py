"""A run's history stored in sealed segments, so a checkpoint write stays bounded however long the run.

The history (the program's record of every finished step) lives in two places: complete segments of
SEGMENT entries in `run_history` rows, each written once, in the fenced transaction of the checkpoint
that completed it; and the open tail (fewer than SEGMENT entries) in the checkpoint blob itself, with
`history_sealed` = how many entries precede it. A checkpoint write therefore carries at most SEGMENT - 1
history entries plus, once every SEGMENT steps, one segment: flat in the run's length. Reading a run
joins them again (one more SELECT, only for runs longer than SEGMENT steps), so programs, replays and
the verdict see the whole history exactly as before. Blobs from before this (codec version 1) carry
the whole history and no `history_sealed`: they read as they are and are split on their next write.

A segment's content is fixed once written: its entries precede the checkpoint that sealed it, and a
later holder resumes from that checkpoint or a later one. A retried transaction rewrites the same
segment (delete + insert by its key), so a lost commit reply cannot duplicate one. So a process keeps
the segments it has read (`load`) and those its own committed checkpoints sealed (`written`): a run's
next claim in the same process joins its history without reading the database again, unless another
process sealed a segment since.

An entry is fixed once recorded, in the tail as in a segment: `EntryBytes` encodes each entry once for
all the writes of one delivery (a step writes two checkpoints, and an inline delivery several steps), so
a write encodes only what is new since the last one. A program that changes a recorded entry in place
afterwards changes nothing stored; one that puts a new object at a position has it encoded.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from checkpoints import codec
from checkpoints.schema import run_history
from fenced_core import jsonbytes

SEGMENT = 16
SEALED = "history_sealed"
WHOLE = "history_whole"  # set by load_txn, never stored: "history" is the whole history, not the tail


@dataclass(frozen=True)
class Stored:
    """What one checkpoint write stores: the row's blob, the segments to seal, the new sealed count."""

    blob: bytes
    segments: list[tuple[int, bytes]] = field(default_factory=list)  # (seq, blob of SEGMENT entries)
    sealed: int = 0


class EntryBytes:
    """Each history entry's JSON (fenced_core.jsonbytes), encoded once for the writes that follow: the
    bytes at a position are reused while the same object (identity, not equality) stands there."""

    def __init__(self) -> None:
        self._at: dict[int, tuple[Any, bytes]] = {}

    def __len__(self) -> int:
        """How many entries' bytes it holds (at most a segment's and a tail's: sealed ones are forgotten)."""
        return len(self._at)

    def of(self, entries: list[Any], start: int, stop: int) -> list[bytes]:
        """The JSON of entries[start:stop], one bytes each; positions before `start` are forgotten."""
        for i in [i for i in self._at if i < start]:
            del self._at[i]
        out = []
        for i in range(start, stop):
            known = self._at.get(i)
            if known is None or known[0] is not entries[i]:
                known = self._at[i] = (entries[i], jsonbytes.dumps(entries[i]))
            out.append(known[1])
        return out


def store(checkpoint: dict[str, Any], sealed: int, entries: EntryBytes | None = None) -> Stored:
    """Split `checkpoint` (whose "history" is the whole history) given `sealed` entries already stored in
    segments: every complete segment not yet stored is sealed now; the blob keeps the open tail.
    `entries`: the bytes of entries encoded by earlier writes (a new EntryBytes when not given)."""
    history: list[Any] = list(checkpoint.get("history", []))
    if sealed % SEGMENT or sealed > len(history):
        raise ValueError(f"history_sealed={sealed} does not fit a history of {len(history)} entries")
    entries = EntryBytes() if entries is None else entries
    complete = len(history) // SEGMENT * SEGMENT
    segments = [(start // SEGMENT, codec.encode({}, encoded=("entries", entries.of(history, start, start + SEGMENT))))
                for start in range(sealed, complete, SEGMENT)]
    body = {k: v for k, v in checkpoint.items() if k not in (WHOLE, SEALED, "history")}
    if complete:  # a run shorter than one segment stores its checkpoint exactly as given
        body[SEALED] = complete
    if "history" not in checkpoint:
        return Stored(codec.encode(body), segments, complete)
    return Stored(codec.encode(body, encoded=("history", entries.of(history, complete, len(history)))),
                  segments, complete)


def sealed_of(checkpoint: dict[str, Any]) -> int:
    """How many leading history entries the run's storage holds in segments (0 for a version 1 blob)."""
    return int(checkpoint.get(SEALED, 0))


def length(checkpoint: dict[str, Any]) -> int:
    """How many entries the run's history has, from a loaded checkpoint or from a row's blob alone."""
    tail = len(checkpoint.get("history", []))
    return tail if checkpoint.get(WHOLE) else sealed_of(checkpoint) + tail


def write_segments_txn(conn: Connection, run_id: str, segments: list[tuple[int, bytes]]) -> None:
    """Store `segments` in the caller's (fenced) transaction, after its fenced update succeeded."""
    for seq, blob in segments:
        conn.execute(sa.delete(run_history).where(run_history.c.run_id == run_id, run_history.c.seq == seq))
        conn.execute(sa.insert(run_history).values(run_id=run_id, seq=seq, body=blob))


# What write_segments_txn writes, as statements for a one-round-trip query on MySQL/MariaDB (SQLite runs it
# through checkpoints.sqlite_multi; checkpoints.runs): each segment replaced by its key, only where `{0}`
# (the caller's fence) holds.
_RAW_SEGMENT_IF = ("DELETE FROM run_history WHERE run_id = %s AND seq = %s AND {0}; "
                   "INSERT INTO run_history (run_id, seq, body) SELECT %s, %s, %s FROM DUAL WHERE {0}; ")


def raw_segments(run_id: str, segments: list[tuple[int, bytes]], condition: str) -> tuple[str, list[Any]]:
    """The statements (each ending in "; ") and parameters that store `segments` if `condition` holds."""
    params = [v for seq, blob in segments for v in (run_id, seq, run_id, seq, blob)]
    return _RAW_SEGMENT_IF.format(condition) * len(segments), params


def load_txn(conn: Connection, run_id: str, checkpoint: dict[str, Any]) -> dict[str, Any]:
    """`checkpoint` (as decoded from the row) with its whole history: the sealed segments, then the tail."""
    sealed = sealed_of(checkpoint)
    if not sealed:
        return checkpoint
    blobs = _read_txn(conn, run_id, sealed // SEGMENT)
    _SEEN.put(str(conn.engine.url), run_id, list(enumerate(blobs)))
    return _joined(checkpoint, blobs)


def written(run_id: str, segments: list[tuple[int, bytes]]) -> None:
    """After the fenced transaction that sealed `segments` committed (never before: a holder fenced out
    wrote nothing, and the step it recorded runs again on another holder, perhaps differently): they
    are what the run store holds for good, so this process's next claim of the run joins them without
    reading them back (the default database's, as every checkpoint write is)."""
    if segments:
        _SEEN.put(_default_store(), run_id, segments)


def load(run_id: str, checkpoint: dict[str, Any]) -> dict[str, Any]:
    """As `load_txn`, outside a transaction: the segments this process read before, else read in a read
    transaction of its own (the run store's default database)."""
    from checkpoints.db import transaction

    sealed = sealed_of(checkpoint)
    if not sealed:
        return checkpoint
    blobs = _SEEN.get(_default_store(), run_id, sealed // SEGMENT)
    if blobs is None:
        with transaction(readonly=True) as conn:
            return load_txn(conn, run_id, checkpoint)
    return _joined(checkpoint, blobs)


def _read_txn(conn: Connection, run_id: str, count: int) -> list[bytes]:
    rows = conn.execute(sa.select(run_history.c.seq, run_history.c.body)
                        .where(run_history.c.run_id == run_id, run_history.c.seq < count)
                        .order_by(run_history.c.seq)).all()
    if [r.seq for r in rows] != list(range(count)):
        raise RuntimeError(f"run {run_id}: history segments {[r.seq for r in rows]} stored, {count} expected")
    return [r.body for r in rows]


def _joined(checkpoint: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
    head = [e for blob in blobs for e in codec.decode(blob)["entries"]]
    return {**checkpoint, "history": head + list(checkpoint.get("history", [])), WHOLE: True}


def _default_store() -> str:
    """The key `load_txn` files segments under for the default database: its engine's URL, as a string."""
    from checkpoints.db import get_engine

    return str(get_engine().url)


class _Seen:
    """Sealed segments this process read, as stored (blobs: each delivery decodes its own entries, so a
    program that changes one in place changes nothing another delivery reads), by store, run and seq.
    At most SEEN_SEGMENTS; the least recently used go first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._blobs: OrderedDict[tuple[str, str, int], bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, store: str, run_id: str, count: int) -> list[bytes] | None:
        """Segments 0 .. count - 1 of the run, if this process holds every one of them."""
        wanted = [(store, run_id, seq) for seq in range(count)]
        with self._lock:
            if not all(key in self._blobs for key in wanted):
                return None
            for key in wanted:
                self._blobs.move_to_end(key)
            return [self._blobs[key] for key in wanted]

    def put(self, store: str, run_id: str, segments: list[tuple[int, bytes]]) -> None:
        """Keep `segments` ((seq, blob) pairs) of the run."""
        with self._lock:
            for seq, blob in segments:
                self._blobs[(store, run_id, seq)] = blob
                self._blobs.move_to_end((store, run_id, seq))
            while len(self._blobs) > self.size:
                self._blobs.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._blobs.clear()

    def _after_fork(self) -> None:  # a lock held by another thread at fork would never be released
        self._lock = threading.Lock()


# About 2 KB each (16 entries of a step record, compressed): a few MB for a process's long runs.
SEEN_SEGMENTS = 2048
_SEEN = _Seen(SEEN_SEGMENTS)
os.register_at_fork(after_in_child=_SEEN._after_fork)
