"""Exact prefix reuse: a ring of session checkpoints keyed by the token prefix each one holds.

A checkpoint (Session.checkpoint()) is the committed state after exactly its tokens: restoring it and running
the rest of a prompt is bit-identical to running the whole prompt (prefill is independent of how rows are cut
into windows, and checkpoints are exact). A hybrid model's DeltaNet state is not positional, so a checkpoint
can only serve a prompt that *starts with all of its tokens*: the lookup returns the longest key that is a
prefix of the prompt (never one that merely shares a beginning with it).

Entries are kept in least-recently-used order within a byte budget (Checkpoint.nbytes); adding one that does
not fit evicts the least recently used; one larger than the whole budget is not kept. Not thread-safe: the
timeline (timeline.py) is its only user, from its one worker thread.

Persistence (--slot-save DIR): save_dir writes each entry as a session file (Session.save, through a session
the entry is restored into) and load_dir reads them back (Session.load then Session.checkpoint), most recently
used first, within the budget. The file format is the session's; files this model refuses are skipped.
"""
from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

FILE_SUFFIX = ".strata-session"


@dataclass
class Entry:
    tokens: np.ndarray      # int32 [position]: the prefix this checkpoint holds
    checkpoint: object      # _core.Checkpoint
    nbytes: int
    kind: str               # "prompt" | "answer" | "boundary" | "file"
    key: str = ""           # hash of the tokens (dictionary key, file name)


def token_key(tokens: Sequence[int] | np.ndarray) -> str:
    a = np.ascontiguousarray(np.asarray(tokens, dtype=np.int32))
    return hashlib.blake2b(a.tobytes(), digest_size=16).hexdigest()


@dataclass
class CacheStats:
    lookups: int = 0
    hits: int = 0
    hit_tokens: int = 0
    added: int = 0
    evictions: int = 0
    too_large: int = 0
    by_kind: dict = field(default_factory=dict)


class PrefixCache:
    """Checkpoints by token prefix, LRU within budget_bytes (0: keeps nothing)."""

    def __init__(self, budget_bytes: int):
        if budget_bytes < 0:
            raise ValueError(f"bad prefix cache budget {budget_bytes}: must be >= 0 bytes")
        self.budget = int(budget_bytes)
        self._entries: OrderedDict[str, Entry] = OrderedDict()  # least recently used first
        self.nbytes = 0
        self.stats = CacheStats()

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[Entry]:
        """Most recently used first."""
        return list(reversed(self._entries.values()))

    def contains(self, tokens: Sequence[int]) -> bool:
        return token_key(tokens) in self._entries

    def lookup(self, ids: Sequence[int] | np.ndarray, limit: int) -> Entry | None:
        """The entry with the longest key that is a prefix of ids[:limit] (marked used), or None."""
        self.stats.lookups += 1
        arr = np.asarray(ids, dtype=np.int32)[:limit]
        best = None
        for e in self._entries.values():
            n = len(e.tokens)
            if 0 < n <= len(arr) and (best is None or n > len(best.tokens)) and np.array_equal(arr[:n], e.tokens):
                best = e
        if best is not None:
            self._entries.move_to_end(best.key)
            self.stats.hits += 1
            self.stats.hit_tokens += len(best.tokens)
        return best

    def add(self, tokens: Sequence[int], checkpoint, kind: str) -> bool:
        """Keep `checkpoint` (the state after exactly `tokens`); refreshes an entry of the same tokens.
        Returns False when it cannot be kept (larger than the whole budget)."""
        arr = np.array(tokens, dtype=np.int32)
        if len(arr) == 0:
            return False
        key = token_key(arr)
        if key in self._entries:
            self._entries.move_to_end(key)
            return True
        nbytes = int(checkpoint.nbytes)
        if nbytes > self.budget:
            self.stats.too_large += 1
            return False
        while self.nbytes + nbytes > self.budget:
            _, old = self._entries.popitem(last=False)
            self.nbytes -= old.nbytes
            self.stats.evictions += 1
        self._entries[key] = Entry(arr, checkpoint, nbytes, kind, key)
        self.nbytes += nbytes
        self.stats.added += 1
        self.stats.by_kind[kind] = self.stats.by_kind.get(kind, 0) + 1
        return True

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0


def save_dir(cache: PrefixCache, session, directory: str | Path) -> list[Path]:
    """Write every entry to `directory` as a session file; files of entries no longer held are removed.
    Uses (and leaves reset) `session`, which must be idle."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    written = []
    keep = set()
    # oldest first, so that file modification times follow recency (load_dir reads the newest first)
    for e in reversed(cache.entries()):
        path = d / (e.key + FILE_SUFFIX)
        keep.add(path.name)
        session.restore(e.checkpoint)
        session.save(path)
        written.append(path)
    session.reset()
    for p in d.glob("*" + FILE_SUFFIX):
        if p.name not in keep:
            p.unlink()
    return written


def load_dir(cache: PrefixCache, session, directory: str | Path) -> tuple[int, list[str]]:
    """Read the session files of `directory` into the cache, newest first, while they fit. Returns how many
    were loaded and one line per file refused (another model, damaged, longer than the context)."""
    d = Path(directory)
    if not d.is_dir():
        return 0, []
    files = sorted(d.glob("*" + FILE_SUFFIX), key=lambda p: os.stat(p).st_mtime, reverse=True)
    loaded, refused = 0, []
    for p in files:
        try:
            session.load(p)
        except (ValueError, RuntimeError, OSError) as e:
            refused.append(f"{p}: {e}")
            continue
        cp = session.checkpoint()  # files come newest first: an older one never evicts a newer one

        if cache.nbytes + cp.nbytes > cache.budget:
            break
        if cache.add(session.tokens, cp, "file"):
            cache._entries.move_to_end(token_key(session.tokens), last=False)  # older than those before it
            loaded += 1
    session.reset()
    return loaded, refused
