"""Strom: persistent event streaming for HPC workflows.

A :class:`Driver` connects to a group of Strom servers (``Driver.connect``)
or runs one inside this process (``Driver.embedded``). Topics make
producers, which batch in the background and return futures, and named
consumers, which receive metadata ahead of demand and fetch only the
selected part of each event's data (see :mod:`strom.select`).

Network progress runs on Strom's own threads, so a Python program that is
busy computing never stalls delivery; every call that waits releases the
GIL. Data moves between Python buffers (bytes, numpy arrays, ...) and the
network without copies.

Example::

    import strom
    driver = strom.Driver.embedded("./data")
    topic = driver.create_topic("sim", partitions=2)
    with topic.producer() as p:
        p.push({"step": 1}, b"payload")
    for event in topic.consumer("analysis"):
        print(event.metadata, bytes(event.data))
        event.ack()
"""

from __future__ import annotations

from . import errors, select
from ._strom import (
    AckFuture,
    Buffer,
    Consumer,
    Driver,
    Event,
    EventId,
    Producer,
    PushFuture,
    PushFutures,
    Selection,
    Topic,
    __version__,
)
from ._strom import transform as _transform
from .errors import (
    ConnectionError,
    DataCorrupt,
    DataDirLocked,
    DataError,
    DataExpired,
    ForkError,
    GroupFileLive,
    InvalidArgument,
    InvalidMetadata,
    PartitionFailed,
    PartitionUnavailable,
    StromError,
    TimeoutError,
    TopicClosed,
    TopicExists,
    TopicNotFound,
)



def transform(fn, src: Topic, dst: Topic, *, name: str) -> tuple[int, int]:
    """Runs ``fn`` on every event of ``src`` and writes what it returns to
    ``dst``, until ``src`` ends; returns ``(events read, events written)``.

    ``fn(event)`` returns None (drop the event), ``(metadata, data)``,
    ``(metadata, data, descriptor)`` or a list of them; ``data`` may be
    bytes or a numpy array. Source partition ``p`` goes to output partition
    ``p % dst partitions``. Progress is the consumer ``transform.<name>``
    of ``src``: a rerun after a crash resumes there, and nothing is written
    twice as long as ``fn`` gives the same output for the same event
    (docs/transforms.md). An exception from ``fn`` stops the run and is
    raised as the cause of the error.
    """
    return _transform(fn, src, dst, name)


__all__ = [
    "AckFuture",
    "Buffer",
    "Consumer",
    "ConnectionError",
    "DataCorrupt",
    "DataDirLocked",
    "DataError",
    "DataExpired",
    "Driver",
    "Event",
    "EventId",
    "ForkError",
    "GroupFileLive",
    "InvalidArgument",
    "InvalidMetadata",
    "PartitionFailed",
    "PartitionUnavailable",
    "Producer",
    "PushFuture",
    "PushFutures",
    "Selection",
    "StromError",
    "TimeoutError",
    "Topic",
    "TopicClosed",
    "TopicExists",
    "TopicNotFound",
    "__version__",
    "errors",
    "select",
    "transform",
]
