"""Type stubs of the native module ``strom._strom`` (re-exported by ``strom``)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable, Iterator, Sequence
from typing import Any, Literal, Optional, Union

__version__: str

Metadata = Union[dict[str, Any], list[Any], str, bytes, bytearray]
Position = Union[Literal["committed", "beginning", "end"], int, tuple[Literal["offset", "timestamp"], int]]
SelectorResult = Union["Selection", None, bool, tuple[int, int], list[tuple[int, int]]]
DataSelectorArg = Union["Selection", Callable[[Any, dict[str, Any]], SelectorResult], None]
DataBrokerArg = Optional[Callable[[Any, int], Any]]

class EventId:
    """Where an acknowledged event was stored; unpacks as ``(partition, offset)``."""

    partition: int
    offset: int
    def __init__(self, partition: int, offset: int) -> None: ...
    def __len__(self) -> int: ...
    def __getitem__(self, i: int) -> int: ...

class PushFuture:
    """Future of a pushed event; resolves to its ``EventId`` once acknowledged."""

    def wait(self, timeout: Optional[float] = None) -> EventId:
        """Waits (GIL released) and returns the ``EventId``; raises on failure or timeout."""
    def result(self, timeout: Optional[float] = None) -> EventId:
        """Same as ``wait``."""
    def done(self) -> bool:
        """True once stored or failed."""
    def __await__(self) -> Generator[Any, None, EventId]: ...

class PushFutures(Sequence[PushFuture]):
    """The futures of the events one ``Producer.push_many`` call queued, in
    push order: one object for the call; ``futures[i]`` is event ``i``'s
    ``PushFuture``."""

    def wait(self, timeout: Optional[float] = None) -> list[EventId]:
        """Waits (GIL released) until every event is stored; their ``EventId``s
        in push order. Raises the first failed event's error (in push order)."""
    def result(self, timeout: Optional[float] = None) -> list[EventId]:
        """Same as ``wait``."""
    def done(self) -> bool:
        """True once every event is stored or failed."""
    def __len__(self) -> int: ...
    def __getitem__(self, i: int) -> PushFuture: ...  # type: ignore[override]
    def __await__(self) -> Generator[Any, None, list[EventId]]: ...

class AckFuture:
    """Resolves once an ack is persisted on the server."""

    def wait(self, timeout: Optional[float] = None) -> None:
        """Waits (GIL released) until the ack is persisted."""
    def done(self) -> bool:
        """True once persisted (or failed)."""
    def __await__(self) -> Generator[Any, None, None]: ...

class Buffer:
    """Received bytes owned by Strom, exposed through the buffer protocol."""

    @property
    def address(self) -> int:
        """Address of the first byte."""
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

class Event:
    """One consumed event."""

    partition: int
    offset: int
    timestamp: int
    """Server timestamp, microseconds since the UNIX epoch."""
    data_size: int
    """Size of the whole data part on the server."""
    fetched_size: int
    """Bytes fetched (the selected part)."""
    deliveries: int
    """Deliveries so far, this one included (above 1 when a shared group redelivers)."""
    @property
    def metadata(self) -> Any:
        """Decoded metadata (a dict for JSON objects), decoded once and cached."""
    @property
    def raw_metadata(self) -> bytes:
        """Metadata bytes as stored."""
    @property
    def descriptor(self) -> bytes:
        """The producer's data descriptor (JSON dtype/shape/order for arrays)."""
    @property
    def data(self) -> Any:
        """The fetched data without copying: a numpy array for array payloads,
        else a memoryview; the broker's own objects with a Python broker."""
    def ack(self) -> AckFuture:
        """Commits this event (and every earlier one of its partition) for the consumer's name;
        in a shared consumer group, this event alone."""
    def ack_when(self, *results: Union[PushFuture, PushFutures]) -> None:
        """Acks this event once every given push (its results) is stored, and returns
        at once: a worker loop needs no polling, and each ack frees its place in the
        consumer's prefetch window by itself. If a push fails the event is not acked
        (a shared group's member gives it back for another delivery)."""
    def nack(self) -> AckFuture:
        """Shared consumer groups: gives the event back for redelivery now."""

class Producer:
    """Pushes events; a context manager that closes on exit."""

    @property
    def topic(self) -> str: ...
    def push(
        self,
        metadata: Metadata,
        data: Any = None,
        partition: Optional[int] = None,
        descriptor: Optional[bytes] = None,
    ) -> PushFuture:
        """Queues an event and returns its future at once.

        The data is not copied: Strom reads the pushed buffer (bytes,
        bytearray, memoryview, numpy array, any contiguous buffer, or a list
        of them) in place until the event is stored. Do not modify the
        buffer before the returned future resolves (``wait()``, ``await``,
        or ``flush()``/``close()``): a change made earlier may or may not
        reach the stored event. Push a copy to reuse the buffer at once.
        """
    def push_many(
        self,
        events: Iterable[Any],
        metadata: Optional[Metadata] = None,
        partition: Optional[int] = None,
    ) -> PushFutures:
        """Queues many events in one call; one ``PushFutures`` for all.

        With ``metadata``, every item is one event's data (as ``push``
        takes it) and every event gets that metadata, encoded once; without
        it, every item is a ``(metadata, data)`` pair. The GIL is released
        once per call, and the data is lent, not copied, as with ``push``.
        Every item is converted before any is queued: a conversion error
        (``TypeError``, ``ValueError``) queues nothing; an error while
        queuing leaves the events before it queued. Either way the
        exception's ``queued`` is the ``PushFutures`` of the queued events
        (empty when none were), and a note names the failing index.
        """
    def flush(self) -> None:
        """Sends everything pending and waits for the acknowledgements."""
    def close(self) -> None:
        """Flushes, then ends this producer's part of the stream."""
    def __enter__(self) -> Producer: ...
    def __exit__(self, *args: Any) -> bool: ...

class Consumer(Iterator[Event], AsyncIterator[Event]):
    """A named consumer; iterate it (sync or async) until the end of the stream."""

    @property
    def name(self) -> str: ...
    @property
    def topic(self) -> str: ...
    @property
    def group(self) -> Optional[str]: ...
    @property
    def member_id(self) -> Optional[int]: ...
    def pull(self, timeout: Optional[float] = None) -> Optional[Event]:
        """Next event, or None at the end of the stream; raises strom.TimeoutError."""
    def pull_batch(self, max: int, timeout: Optional[float] = None) -> Optional[list[Event]]:
        """Every event that has arrived, up to ``max``, in one call.

        Waits up to ``timeout`` seconds (default: for ever) for the first
        event, never for more. Returns an empty list when the timeout passed
        with nothing to take (``timeout=0`` drains without waiting), and
        None at the end of the stream.
        """
    def pull_many(self, n: int, timeout: Optional[float] = None) -> Optional[list[Event]]:
        """``n`` events in one call.

        Waits (GIL released) until ``n`` events have arrived, the stream
        ends, or ``timeout`` seconds (default: for ever) pass. The list is
        shorter than ``n`` only at the end of the stream, when the timeout
        passed (possibly empty; ``timeout=0`` takes what has arrived), when
        an error followed its events (the next call raises it), or after a
        call a signal handler interrupted (whose events come first). None
        at the end of the stream.
        """
    def pull_async(self, timeout: Optional[float] = None) -> Awaitable[Optional[Event]]:
        """Awaitable pull: next event or None at the end of the stream."""
    def process(
        self,
        on_event: Callable[[Event], Any],
        on_start: Optional[Callable[[], Any]] = None,
        on_end: Optional[Callable[[], Any]] = None,
    ) -> None:
        """on_start once, on_event per event until the end of the stream, on_end once."""
    def seek(self, position: Position) -> None:
        """Moves every partition to a position; queued events are dropped."""
    def close(self) -> None:
        """Ends the subscriptions."""
    def __iter__(self) -> Consumer: ...
    def __next__(self) -> Event: ...
    def __aiter__(self) -> Consumer: ...
    def __anext__(self) -> Awaitable[Event]: ...
    def __enter__(self) -> Consumer: ...
    def __exit__(self, *args: Any) -> bool: ...

class Topic:
    """A topic: makes producers and consumers."""

    @property
    def name(self) -> str: ...
    @property
    def partitions(self) -> int: ...
    def describe(self) -> dict[str, Any]:
        """Fresh description: spec, partitions with offsets, stream state."""
    def complete(self) -> None:
        """Ends the stream explicitly."""
    def producer(
        self,
        batch: Union[Literal["adaptive"], int, None] = None,
        batch_bytes: Optional[int] = None,
        max_batches: int = 2,
        linger: float = 0.005,
        max_batch_bytes: Optional[int] = None,
        max_event_bytes: Optional[int] = None,
        lease: Optional[float] = 0.0,
        acks: Literal["all", "leader"] = "all",
        idempotent: Optional[bool] = None,
        request_timeout: Optional[float] = None,
    ) -> Producer:
        """A new producer.

        ``batch``: ``"adaptive"`` (default: send whatever is ready whenever
        an in-flight slot frees) or a number of events per batch.
        ``batch_bytes``: the batch size in bytes; alone, batches are sent
        once they hold that many bytes; with ``batch``, it caps a batch of
        several events (a larger single event goes alone). Default: 256 KiB
        of metadata and 4 MiB in all with data parts, or 4 MiB on file
        topics with durability ``always``.
        ``max_event_bytes``: larger events are refused by ``push``
        (default: what the partition's server accepts).
        ``max_batch_bytes``: an older name for ``batch_bytes`` with ``batch``.
        ``lease``: seconds the producer's lease lasts (clamped to 1..300),
        renewed on the client's own threads, even while Python holds the
        GIL; if the process dies its part of the stream ends when the lease
        runs out (``describe()["state"]["expired_producers"]``). ``0``
        (default) takes the server's ``producer_lease_ms``; ``None`` takes
        no lease: the producer stays open until closed.
        ``acks``: ``"all"`` (a replicated partition answers once every
        in-sync copy has the event) or ``"leader"``.
        ``idempotent``: stamp batches with the producer's id and sequence,
        and resend those whose answer was lost to the partition's current
        leader; each is appended once (default: on for replicated topics).
        ``request_timeout``: seconds a partition's server may leave every
        batch unanswered before its connection is given up and the batches
        fail as on a lost connection (an idempotent producer resends them);
        default 30, Kafka's ``request.timeout.ms``.
        """
    def consumer(
        self,
        name: Optional[str] = None,
        partitions: Optional[Sequence[int]] = None,
        data_selector: DataSelectorArg = None,
        data_broker: DataBrokerArg = None,
        start: Optional[Position] = None,
        prefetch: Optional[int] = None,
        prefetch_bytes: Optional[int] = None,
        *,
        group: Optional[str] = None,
        mode: str = "partitioned",
        session_timeout: float = 10.0,
        visibility_timeout: float = 30.0,
        max_deliveries: Optional[int] = None,
        dead_letter: Optional[str] = None,
    ) -> Consumer:
        """A consumer named ``name``; resumes after the name's last ack by default.
        With ``group=``, a member of that consumer group (``mode="shared"``:
        a work queue, each event acked on its own)."""

class Driver:
    """A handle on a Strom deployment."""

    @staticmethod
    def connect(
        group_file: Union[str, os.PathLike[str], None] = None,
        *,
        address: Optional[str] = None,
        token: Optional[str] = None,
    ) -> Driver:
        """Connects to the group of a group file, or to ``host:port``,
        presenting ``token`` (else ``$STROM_TOKEN`` / ``$STROM_TOKEN_FILE``)."""
    @staticmethod
    def embedded(
        path: Union[str, os.PathLike[str]],
        *,
        listen: Optional[str] = None,
        group_file: Union[str, os.PathLike[str], None] = None,
        join: Union[str, os.PathLike[str], None] = None,
        cluster_secret_file: Union[str, os.PathLike[str], None] = None,
        insecure: bool = False,
    ) -> Driver:
        """Starts a server inside this process with its data under ``path``: a group
        of its own (writing its group file to ``group_file``), or a member of the
        group ``join`` (a group file) describes."""
    def set_request_timeout(self, seconds: float) -> None:
        """Longest a registry request (topic administration, opening and closing
        producers and consumers, group heartbeats) waits for the registry's
        answer; then it raises ``strom.TimeoutError`` (code 502) instead of waiting
        for ever on a server that stopped answering. Default 30 seconds."""
    def members(self) -> list[dict[str, Any]]:
        """The group's members: ``id``, ``addr`` and ``alive`` of each."""
    @property
    def address(self) -> str:
        """host:port of the server holding the topic registry."""
    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        type: Literal["file", "memory"] = "file",
        durability: str = "always",
        validator: Literal["none", "json", "json-schema"] = "none",
        schema: Union[str, dict[str, Any], None] = None,
        selector: str = "round-robin",
        serializer: Literal["json", "binary"] = "json",
        retention_bytes: Optional[int] = None,
        retention_ms: Optional[int] = None,
        segment_bytes: Optional[int] = None,
        exist_ok: bool = False,
        overflow: Optional[Literal["block", "drop-oldest"]] = None,
        replication_factor: int = 1,
        min_in_sync: Optional[int] = None,
        compression: str = "none",
    ) -> Topic:
        """Creates a topic; with ``exist_ok=True``, returns the existing one of that
        name if it has the same partition count and type (else raises ``TopicExists``).
        ``compression`` (``"none"``, ``"zstd"``, ``"zstd:3"``, ``"lz4"``, ...) makes
        producers compress data parts; consumers decompress transparently."""
    def open_topic(self, name: str) -> Topic:
        """Opens an existing topic."""
    def describe(self, name: str) -> dict[str, Any]:
        """Describes a topic."""
    def list_topics(self) -> list[dict[str, Any]]:
        """Every topic's description."""
    def delete_topic(self, name: str) -> None:
        """Deletes a topic and its data."""
    def consumer_offsets(self, topic: str, partition: int) -> dict[str, int]:
        """Committed offsets of every consumer name on one partition."""
    def describe_group(self, group: str) -> dict[str, Any]:
        """A consumer group: settings, members, per-partition position, lag, pending."""
    def list_groups(self) -> list[dict[str, Any]]: ...
    def delete_group(self, group: str) -> None: ...

class Selection:
    """A data selection (see ``strom.select``)."""

    @staticmethod
    def all() -> Selection: ...
    @staticmethod
    def none() -> Selection: ...
    @staticmethod
    def range(offset: int, length: int) -> Selection: ...
    @staticmethod
    def strided(offset: int, block: int, stride: int, count: int) -> Selection: ...
    @staticmethod
    def ranges(ranges: Sequence[tuple[int, int]]) -> Selection: ...
    @staticmethod
    def where_(field: str, op: str, value: Any, then: Optional[Selection] = None) -> Selection: ...
    @staticmethod
    def array(index: Any) -> Selection: ...

def rust_consume(topic: Topic, name: str, count: int) -> tuple[int, int, float]:
    """Benchmark baseline: consume with the Rust client; (events, bytes, seconds)."""

def rust_push(topic: Topic, metadata: str, count: int) -> list[int]:
    """Benchmark baseline: per-call push times (ns) of the Rust client."""

def transform(f: Any, src: Topic, dst: Topic, name: str) -> tuple[int, int]:
    """A user-defined transform from ``src`` to ``dst`` (see ``strom.transform``)."""
