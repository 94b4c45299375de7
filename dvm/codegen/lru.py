"""Caches bounded by entries and by bytes, whose sizes `dvm.counters()` reports.

A BoundedDict is a dict: reads are plain dict reads (lock-free, C speed, safe under the GIL while
another thread inserts), so hot paths keep their cost. Insertions go through `put`, which charges
the entry's estimated bytes and evicts the least recently used entries (recency: insertion, or
`touch`) beyond the dict's own entry bound. Dicts of one kind (every compiled graph's program
cache, say) share a CacheFamily: one byte budget for all of them, so the total stays bounded
however many dicts exist; beyond it, the least recently used dict of the family gives up its
oldest entries first. A dict that is garbage-collected hands its bytes back to the family.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable

_FAMILIES: "dict[str, CacheFamily]" = {}


class _Account:
    """What one dict holds (kept apart from it so the family can settle after the dict died)."""
    __slots__ = ("entries", "bytes")

    def __init__(self) -> None:
        self.entries = 0
        self.bytes = 0


class CacheFamily:
    """Dicts that share one byte budget (and one lock for their insertions and evictions)."""

    def __init__(self, name: str, max_bytes: int | Callable[[], int]):
        self.name = name
        self._max_bytes = max_bytes
        self.lock = threading.RLock()
        self.members: "OrderedDict[int, tuple[weakref.ref, _Account]]" = OrderedDict()  # least recent first
        self.entries = self.bytes = self.evictions = 0
        _FAMILIES[name] = self

    @property
    def max_bytes(self) -> int:
        return self._max_bytes() if callable(self._max_bytes) else self._max_bytes

    def _join(self, member: "BoundedDict") -> _Account:
        account = _Account()
        with self.lock:
            self.members[id(member)] = (weakref.ref(member), account)
        weakref.finalize(member, self._leave, id(member), account)
        return account

    def _leave(self, key: int, account: _Account) -> None:
        with self.lock:
            self.members.pop(key, None)
            self.entries -= account.entries
            self.bytes -= account.bytes

    def _used(self, member: "BoundedDict") -> None:
        self.members.move_to_end(id(member))

    def _over_budget(self, keep: "BoundedDict") -> None:
        """Evict, least recently used dict first, until the family is within its budget (the
        entry just inserted into `keep` stays, even when it alone exceeds the budget)."""
        budget = self.max_bytes
        while self.bytes > budget:
            for ref, account in self.members.values():
                member = ref()
                if member is not None and account.entries and (member is not keep or account.entries > 1):
                    member._evict_oldest()
                    break
            else:
                return

    def stats(self) -> dict[str, int]:
        with self.lock:
            return {f"cache_{self.name}_entries": self.entries, f"cache_{self.name}_bytes": self.bytes,
                    f"cache_{self.name}_evictions": self.evictions}


class BoundedDict(dict):
    """A dict bounded by `max_entries` (an int, or a function read at each insertion) and by its
    family's byte budget. Read with `get` / `[]`; insert with `put`; `touch` marks a hit."""
    __slots__ = ("family", "max_entries", "_sizes", "_account", "__weakref__")

    def __init__(self, family: CacheFamily, max_entries: int | Callable[[], int]):
        super().__init__()
        self.family, self.max_entries = family, max_entries
        self._sizes: dict = {}   # key -> charged bytes, in recency order (least recent first)
        self._account = family._join(self)

    def put(self, key, value, nbytes: int) -> Any:
        """Insert `value` unless `key` is present (then the present value stays); returns the
        value now stored. Evicts beyond the entry bound and the family's byte budget."""
        fam = self.family
        with fam.lock:
            old = dict.get(self, key)
            if old is not None:
                self._refresh(key)
                return old
            dict.__setitem__(self, key, value)
            self._sizes[key] = nbytes
            acc = self._account
            acc.entries += 1
            acc.bytes += nbytes
            fam.entries += 1
            fam.bytes += nbytes
            fam._used(self)
            limit = self.max_entries() if callable(self.max_entries) else self.max_entries
            while acc.entries > max(1, limit):
                self._evict_oldest()
            if fam.bytes > fam.max_bytes:
                fam._over_budget(self)
            return value

    def touch(self, key) -> None:
        """Mark `key` as just used (a cache hit)."""
        with self.family.lock:
            if key in self._sizes:
                self._refresh(key)
                self.family._used(self)

    def _refresh(self, key) -> None:
        self._sizes[key] = self._sizes.pop(key)

    def _evict_oldest(self) -> None:
        """Drop the least recently used entry (the caller holds the family lock)."""
        key = next(iter(self._sizes))
        nbytes = self._sizes.pop(key)
        dict.pop(self, key, None)
        acc, fam = self._account, self.family
        acc.entries -= 1
        acc.bytes -= nbytes
        fam.entries -= 1
        fam.bytes -= nbytes
        fam.evictions += 1

    def clear(self) -> None:
        with self.family.lock:
            while self._sizes:
                self._evict_oldest()
            dict.clear(self)

    @property
    def nbytes(self) -> int:
        return self._account.bytes

    # a BoundedDict is inserted into with put() only (the bounds and the accounting need it)
    def __setitem__(self, key, value):
        raise TypeError("BoundedDict: insert with put(key, value, nbytes)")

    def setdefault(self, key, default=None):
        raise TypeError("BoundedDict: insert with put(key, value, nbytes)")

    def update(self, *args, **kwargs):
        raise TypeError("BoundedDict: insert with put(key, value, nbytes)")

    def _no_removal(self, *args):
        raise TypeError("BoundedDict: entries leave by eviction or clear() only")

    pop = popitem = __delitem__ = _no_removal


def family(name: str, max_bytes: int | Callable[[], int]) -> CacheFamily:
    """The family called `name`, created with this budget on first use."""
    fam = _FAMILIES.get(name)
    return fam if fam is not None else CacheFamily(name, max_bytes)


def cache_stats() -> dict[str, int]:
    """Entries, bytes and evictions of every cache family (what dvm.counters() reports)."""
    out: dict[str, int] = {}
    for fam in list(_FAMILIES.values()):
        out.update(fam.stats())
    return out
