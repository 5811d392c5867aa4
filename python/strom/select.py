"""Data selections: which bytes of each event's data a consumer fetches.

Pass one as ``Topic.consumer(..., data_selector=...)``. These built-in
selections are evaluated in Rust on Strom's network threads and never take
the GIL. A Python callable ``f(metadata, info) -> selection`` is accepted
too (it may return one of these, ``None``/``False`` for nothing, ``True``
for everything, an ``(offset, length)`` tuple or a list of them).

Example::

    strom.select.range(0, 4096)                 # the first 4 KiB
    strom.select.where("kind", "==", "frame")   # all data of matching events
    strom.select.array[:, 10:20, ::2]           # a sub-array of numpy payloads
"""

from __future__ import annotations

import builtins
from typing import Any, Iterable

from ._strom import Selection

__all__ = ["Selection", "all", "none", "range", "strided", "ranges", "where", "array"]


def all() -> Selection:  # noqa: A001 - the natural name
    """Fetch the whole data part (the default)."""
    return Selection.all()


def none() -> Selection:
    """Fetch no data: metadata only."""
    return Selection.none()


def range(offset: int, length: int) -> Selection:  # noqa: A001
    """Fetch ``length`` bytes starting at byte ``offset``."""
    return Selection.range(offset, length)


def strided(offset: int, block: int, stride: int, count: int) -> Selection:
    """Fetch ``count`` blocks of ``block`` bytes, the first at ``offset``,
    each ``stride`` bytes after the previous one."""
    return Selection.strided(offset, block, stride, count)


def ranges(ranges: Iterable[tuple[int, int]]) -> Selection:
    """Fetch a list of ``(offset, length)`` byte ranges, in the given order."""
    return Selection.ranges(builtins.list(ranges))


def where(field: str, op: str, value: Any, then: Selection | None = None) -> Selection:
    """Fetch ``then`` (default: all the data) of events whose metadata field
    compares true, nothing of the others.

    ``field`` is a top-level key or a JSON pointer (``"/a/b"``); ``op`` is
    one of ``== != < <= > >=``. Numbers compare as numbers and strings
    lexicographically; a missing field or mismatched types select nothing
    (except for ``!=``).
    """
    return Selection.where_(field, op, value, then)


class _ArrayIndexer:
    """``strom.select.array[index]``: a sub-array of numpy payloads.

    The index takes integers, slices (any step, negative too) and ``...``,
    as numpy basic indexing. For each event pushed as a numpy array, the
    consumer and server compute the byte ranges of that region from the
    array's dtype, shape and order, and only those bytes are fetched; the
    consumer's ``event.data`` is a numpy array of the region's shape.
    """

    def __getitem__(self, index: Any) -> Selection:
        return Selection.array(index)

    def __call__(self, index: Any) -> Selection:
        """Same as ``array[index]``, for an index built elsewhere."""
        return Selection.array(index)

    def __repr__(self) -> str:
        return "strom.select.array"


array = _ArrayIndexer()
