"""Workflow provenance from Dask into a Strom topic (docs/provenance.md).

Every task that finishes (its result in memory, or an error) becomes one
event whose metadata is a JSON record: the task's key and group, its
status, the worker, when it started and stopped computing, how long each
of its actions took (compute, transfer, disk), the size and type of its
result, the task's annotations (``dask.annotate``) and, for an error, the
exception's text.

Capture never waits for the network: a record is queued on a Strom
producer, which batches in the background on Strom's own threads, and the
scheduler's or worker's loop goes on. Records are published either by the
scheduler (:class:`ProvenancePlugin`, one producer, the default) or by each
worker (:class:`WorkerProvenancePlugin`, one producer per worker). When
the plugin closes, its producer closes; once every producer closed the
topic's stream ends, and :func:`read_topic` returns.

Example::

    from distributed import Client
    import strom.dask

    client = Client()
    client.register_plugin(strom.dask.ProvenancePlugin(group_file="group.json"))
    ...  # run the workflow
    client.close()
    records = strom.dask.read_topic("dask.provenance", group_file="group.json")

The plugins take any ``sink`` with ``open()``, ``publish(record)`` and
``close()``; :class:`StromSink` is the default (the provenance example
compares it with a Kafka sink). A sink must pickle before ``open()``:
Dask ships plugins to the scheduler and the workers.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Optional, Protocol, Union

from dask.utils import key_split
from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

from ._strom import Driver
from .errors import StromError, TimeoutError

#: The topic records go to unless told otherwise.
DEFAULT_TOPIC = "dask.provenance"


class Sink(Protocol):
    """Where provenance records go."""

    def open(self) -> None: ...
    def publish(self, record: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


class StromSink:
    """Publishes records to a Strom topic, created if missing.

    Connects in :meth:`open` (so the sink pickles until then), to the group
    of ``group_file`` or to ``address``, presenting ``token`` (else
    ``$STROM_TOKEN`` / ``$STROM_TOKEN_FILE``). A record that cannot be
    queued (the topic was deleted, the server is gone) is counted in
    :attr:`failed`, never raised into the workflow.

    Records are small and come a few hundred a second, so the producer
    batches up to ``batch`` of them for up to ``linger`` seconds, and a
    topic it creates syncs to disk in the background (``durability``,
    default ``interval:1000``: a server crash loses nothing, a power cut
    at most the last second), not once per batch: capture then costs the
    server a few per cent of what one fsync per record would.
    """

    def __init__(
        self,
        topic: str = DEFAULT_TOPIC,
        group_file: Union[str, os.PathLike[str], None] = None,
        *,
        address: Optional[str] = None,
        token: Optional[str] = None,
        partitions: int = 1,
        durability: str = "interval:1000",
        batch: int = 256,
        linger: float = 0.01,
    ) -> None:
        self.topic = topic
        self.durability = durability
        self.batch = batch
        self.linger = linger
        self.group_file = os.fspath(group_file) if group_file is not None else None
        self.address = address
        self.token = token
        self.partitions = partitions
        self.published = 0
        self.failed = 0
        self._driver: Optional[Driver] = None
        self._producer: Any = None

    def __getstate__(self) -> dict[str, Any]:
        # Only the settings travel; a connection never does, and a copy
        # counts its own records.
        state = self.__dict__.copy()
        state.update(_driver=None, _producer=None, published=0, failed=0)
        return state

    def open(self) -> None:
        if self._producer is not None:
            return
        self._driver = Driver.connect(self.group_file, address=self.address, token=self.token)
        topic = self._driver.create_topic(
            self.topic, partitions=self.partitions, durability=self.durability, exist_ok=True
        )
        self._producer = topic.producer(batch=self.batch, linger=self.linger)

    def publish(self, record: dict[str, Any]) -> None:
        if self._producer is None:
            self.failed += 1
            return
        try:
            self._producer.push(record)
            self.published += 1
        except StromError:
            self.failed += 1

    def close(self) -> None:
        p, self._producer = self._producer, None
        if p is not None:
            p.close()
        self._driver = None


def task_record(
    key: Any,
    ok: bool,
    *,
    worker: Optional[str],
    startstops: Any,
    nbytes: Optional[int],
    typename: Optional[str],
    annotations: Optional[dict[str, Any]],
    exception: Optional[str],
    source: str,
) -> dict[str, Any]:
    """The provenance record of one finished task (JSON-ready)."""
    actions: dict[str, float] = {}
    start = stop = None
    for s in startstops or ():
        action = str(s.get("action", "?"))
        t0, t1 = float(s.get("start", 0.0)), float(s.get("stop", 0.0))
        actions[action] = actions.get(action, 0.0) + max(t1 - t0, 0.0)
        if action == "compute":
            start = t0 if start is None else min(start, t0)
            stop = t1 if stop is None else max(stop, t1)
    record: dict[str, Any] = {
        "key": str(key),
        "group": key_split(key),
        "status": "ok" if ok else "error",
        "worker": worker,
        "start": start,
        "stop": stop,
        "actions": actions,
        "nbytes": nbytes if nbytes is not None and nbytes >= 0 else None,
        "type": typename,
        "source": source,
    }
    if annotations:
        record["annotations"] = {str(k): _json_safe(v) for k, v in annotations.items()}
    if exception:
        record["exception"] = exception
    return record


def _json_safe(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    return repr(v)


class _Capture:
    """What both plugins are made with: a ``sink``, else a
    :class:`StromSink` on ``topic`` of ``group_file`` or ``address``."""

    def __init__(
        self,
        sink: Optional[Sink] = None,
        *,
        topic: str = DEFAULT_TOPIC,
        group_file: Union[str, os.PathLike[str], None] = None,
        address: Optional[str] = None,
        token: Optional[str] = None,
    ) -> None:
        self.sink = sink or StromSink(topic, group_file, address=address, token=token)


class ProvenancePlugin(_Capture, SchedulerPlugin):
    """Publishes a record for every task the scheduler sees finish.

    Register it with ``client.register_plugin(ProvenancePlugin(...))``.
    With no ``sink``, records go to ``topic`` through a :class:`StromSink`
    on ``group_file`` or ``address``. The scheduler learns of a task when
    its worker reports it, so ``start`` and ``stop`` are the worker's
    clock and ``worker`` is its address.
    """

    name = "strom-provenance"

    scheduler: Any = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        # Connecting may wait for the network: not on the scheduler's loop.
        await asyncio.get_running_loop().run_in_executor(None, self.sink.open)

    def transition(
        self, key: Any, start: str, finish: str, *args: Any, stimulus_id: str = "", **kw: Any
    ) -> None:
        if start != "processing" or finish not in ("memory", "erred"):
            return
        ts = self.scheduler.tasks.get(key) if self.scheduler is not None else None
        self.sink.publish(
            task_record(
                key,
                finish == "memory",
                worker=kw.get("worker"),
                startstops=kw.get("startstops"),
                nbytes=kw.get("nbytes"),
                typename=kw.get("typename"),
                annotations=ts.annotations if ts is not None else None,
                exception=kw.get("exception_text"),
                source="scheduler",
            )
        )

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.sink.close)


class WorkerProvenancePlugin(_Capture, WorkerPlugin):
    """Publishes, from each worker, a record for every task it finishes.

    Register it with ``client.register_plugin(WorkerProvenancePlugin(...))``;
    each worker gets its own copy of the sink and its own producer, so the
    scheduler does no work for provenance at all. The stream ends once
    every worker's plugin closed (the workers stopped).
    """

    name = "strom-provenance-worker"

    worker: Any = None

    def setup(self, worker: Any) -> None:
        self.worker = worker
        self.sink.open()

    def transition(self, key: Any, start: str, finish: str, **kw: Any) -> None:
        if start != "executing" or finish not in ("memory", "error"):
            return
        ts = self.worker.state.tasks.get(key) if self.worker is not None else None
        error = getattr(ts, "exception_text", None) if finish == "error" else None
        self.sink.publish(
            task_record(
                key,
                finish == "memory",
                worker=getattr(self.worker, "address", None),
                startstops=getattr(ts, "startstops", None),
                nbytes=getattr(ts, "nbytes", None),
                typename=getattr(ts, "type", None).__name__ if getattr(ts, "type", None) else None,
                annotations=getattr(ts, "annotations", None),
                exception=error or None,
                source="worker",
            )
        )

    def teardown(self, worker: Any) -> None:
        self.sink.close()


def read_topic(
    topic: str = DEFAULT_TOPIC,
    group_file: Union[str, os.PathLike[str], None] = None,
    *,
    address: Optional[str] = None,
    token: Optional[str] = None,
    consumer: str = "strom.dask.reader",
    timeout: Optional[float] = None,
) -> list[dict[str, Any]]:
    """Every provenance record of ``topic``, from its beginning.

    Returns at the end of the stream (every producer closed); with
    ``timeout``, also once no record came for that many seconds. Records
    keep their order per partition. ``pandas.DataFrame(read_topic(...))``
    gives a table.
    """
    driver = Driver.connect(
        os.fspath(group_file) if group_file is not None else None, address=address, token=token
    )
    c = driver.open_topic(topic).consumer(consumer, start="beginning")
    out: list[dict[str, Any]] = []
    try:
        while True:
            try:
                ev = c.pull(timeout=timeout)
            except TimeoutError:
                break
            if ev is None:
                break
            out.append(ev.metadata)
    finally:
        c.close()
    return out
