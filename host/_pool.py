"""Reusable per-call device buffers, keyed by memory bank and size bucket.

Allocating a device buffer (an XRT ``bo``, a PYNQ buffer, an emulated device array) costs far more
than reusing one, and a serving loop calls the same kernel with similar batch sizes over and over.
Sizes are rounded up to a power of two (at least 4 KiB) so batches of nearby sizes share buffers.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Callable, Generic, Hashable, TypeVar

__all__ = ["BufferPool", "bucket_size"]

T = TypeVar("T")

_MIN_BUCKET = 4096


def bucket_size(nbytes: int) -> int:
    """The allocation size used for a request of ``nbytes`` (power of two, >= 4 KiB)."""
    n = max(int(nbytes), _MIN_BUCKET)
    return 1 << (n - 1).bit_length()


class BufferPool(Generic[T]):
    """Thread-safe free lists of buffers per ``(bank, bucket)``.

    Example::

        pool = BufferPool(lambda bank, size: bytearray(size))
        key, buf = pool.acquire(bank=0, nbytes=1000)    # a 4096-byte buffer
        pool.release(key, buf)                          # reused by the next acquire of that key
    """

    def __init__(self, alloc: Callable[[Hashable, int], T], free: Callable[[T], None] | None = None, keep: int = 8) -> None:
        self._alloc = alloc
        self._free = free
        self._keep = keep
        self._lists: dict[tuple[Hashable, int], list[T]] = defaultdict(list)
        self._lock = threading.Lock()
        self.allocations = 0  # buffers created so far (for tests and the info() display)

    def acquire(self, bank: Hashable, nbytes: int) -> tuple[tuple[Hashable, int], T]:
        key = (bank, bucket_size(nbytes))
        with self._lock:
            free = self._lists[key]
            if free:
                return key, free.pop()
            self.allocations += 1
        return key, self._alloc(bank, key[1])

    def release(self, key: tuple[Hashable, int], buf: T) -> None:
        with self._lock:
            free = self._lists[key]
            if len(free) < self._keep:
                free.append(buf)
                return
        if self._free is not None:
            self._free(buf)

    def close(self) -> None:
        with self._lock:
            lists, self._lists = self._lists, defaultdict(list)
        if self._free is not None:
            for bufs in lists.values():
                for b in bufs:
                    self._free(b)
