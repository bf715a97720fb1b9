"""A process-wide cache of what sorted runs decoded: indexes, bloom filters, blocks."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any


class BlockCache:
    """Decoded run indexes and blocks, least recently used out, within a byte budget.

    Runs are immutable (a part's name is unique and its size and CRC32C are recorded), so
    what a process decoded once stays valid: Spark reuses Python workers across tasks,
    and a worker that served a key group before looks up its old runs without reading
    them again -- the role of RocksDB's block cache. Only lookups use it; compaction
    streams its blocks past it.
    """

    def __init__(self, budget: int) -> None:
        self.budget, self.used = budget, 0
        self._items: OrderedDict[tuple[Any, ...], tuple[Any, int]] = OrderedDict()

    def get(self, key: tuple[Any, ...]) -> Any:
        """The cached value, or None."""
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: tuple[Any, ...], value: Any, size: int) -> None:
        """Keep ``value`` (``size`` bytes), evicting the least recently used beyond the budget."""
        if size > self.budget or key in self._items:
            return
        self._items[key] = (value, size)
        self.used += size
        while self.used > self.budget:
            _, (_, dropped) = self._items.popitem(last=False)
            self.used -= dropped


#: The process's cache (per Spark Python worker): 256 MiB of decoded indexes and blocks.
BLOCK_CACHE = BlockCache(256 * 1024 * 1024)
