"""MPI channels for Python codes, over mpi4py (docs/mpi.md).

A channel is a Strom topic opened by every rank of a communicator at once,
as the C API's ``strom_mpi_channel_open`` does (include/strom_mpi.h)::

    from mpi4py import MPI
    from strom.mpi import Channel, PRODUCER, CONSUMER

    role = PRODUCER if MPI.COMM_WORLD.rank < 2 else CONSUMER
    with Channel(MPI.COMM_WORLD, role, "steps") as ch:     # collective
        if role == PRODUCER:
            ch.push(field, {"step": 3})                     # numpy arrays stay arrays
            ch.end()                                        # this rank's stream ends
        else:
            for ev in ch:                                   # until every producer ended
                use(ev.data)
                ev.ack()
    # leaving the block closes the channel (collective)

The channel starts embedded servers on each node's lowest ranks (one per
node by default) and exchanges their addresses over the communicator, or
attaches to a running group (``group_file=`` or ``address=``). Consumer
ranks are named consumers ``<consumer_name>-<i>`` with persistent acks, so a
later job resumes after each one's last ack. With ``distribution="share"``
(default) each partition is read by one consumer rank; with ``"broadcast"``
every consumer rank reads everything. Without a ``selector``, producer rank
``i`` writes partition ``i % partitions``, so a consumer reads each
producer's elements in order.

Collective calls (the constructor, ``close``) raise the same
``ChannelError`` on every rank when any rank fails, naming that rank.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any, Callable, Iterator, Optional

from . import _strom

NONE, PRODUCER, CONSUMER, BOTH = 0, 1, 2, 3
_JOIN_WAIT_S = 60.0


class ChannelError(RuntimeError):
    """A collective channel call failed on some rank (``rank`` says which)."""

    def __init__(self, step: str, rank: int, message: str) -> None:
        super().__init__(f"{step} failed on rank {rank}: {message}")
        self.step, self.rank = step, rank


def _agree(comm: Any, step: str, fn: Callable[[], Any]) -> Any:
    """Runs ``fn`` on every rank; raises ChannelError everywhere if any failed."""
    result, error = None, None
    try:
        result = fn()
    except Exception as e:  # noqa: BLE001 - carried to every rank
        error = f"{type(e).__name__}: {e}"
    errors = comm.allgather(error)
    for rank, message in enumerate(errors):
        if message is not None:
            raise ChannelError(step, rank, message)
    return result


class Channel:
    """A collective Strom stream over an MPI communicator (see the module doc)."""

    def __init__(
        self,
        comm: Any,
        role: int,
        topic: str,
        *,
        group_file: Optional[str] = None,
        address: Optional[str] = None,
        servers_per_node: int = 1,
        data_dir: Optional[str] = None,
        listen_host: str = "127.0.0.1",
        insecure: bool = False,
        partitions: Optional[int] = None,
        type: str = "memory",  # noqa: A002 - the name create_topic uses
        selector: Optional[str] = None,
        durability: str = "always",
        distribution: str = "share",
        consumer_name: Optional[str] = None,
        data_selector: Any = None,
    ) -> None:
        self.comm = comm.Dup()
        self.rank, self.size, self.role = self.comm.rank, self.comm.size, role
        self._server: Optional[_strom.Driver] = None
        self._dir: Optional[str] = None
        self.driver: Optional[_strom.Driver] = None
        self.topic: Optional[_strom.Topic] = None
        self.producer: Optional[_strom.Producer] = None
        self.consumer: Optional[_strom.Consumer] = None
        self._ended = False
        try:
            _agree(self.comm, "checking the arguments", lambda: self._check(role, topic, distribution, group_file, address))
            roles = self.comm.allgather(role)
            self._count_roles(roles)
            self._connect(group_file, address, servers_per_node, data_dir, listen_host, insecure)
            self._open_topic(topic, partitions, type, selector, durability)
            _agree(self.comm, "opening the producers", self._open_producer)
            name = consumer_name or topic
            _agree(self.comm, "opening the consumers", lambda: self._open_consumer(name, distribution, data_selector))
        except BaseException:
            self._ended = True  # nothing was pushed: do not end a stream others use
            self._teardown()
            raise

    # ---- open -------------------------------------------------------------

    @staticmethod
    def _check(role: int, topic: str, distribution: str, group_file: Any, address: Any) -> None:
        if role not in (NONE, PRODUCER, CONSUMER, BOTH):
            raise ValueError(f"role {role} is not NONE, PRODUCER, CONSUMER or BOTH")
        if not topic:
            raise ValueError("a channel needs a topic")
        if distribution not in ("share", "broadcast"):
            raise ValueError(f"distribution {distribution!r} is not 'share' or 'broadcast'")
        if group_file and address:
            raise ValueError("give group_file or address, not both")

    def _count_roles(self, roles: list[int]) -> None:
        producers = [r for r, x in enumerate(roles) if x & PRODUCER]
        consumers = [r for r, x in enumerate(roles) if x & CONSUMER]
        self.producers, self.consumers = len(producers), len(consumers)
        self.producer_index = producers.index(self.rank) if self.rank in producers else -1
        self.consumer_index = consumers.index(self.rank) if self.rank in consumers else -1

    def _connect(self, group_file: Any, address: Any, per_node: int, data_dir: Any, host: str, insecure: bool) -> None:
        if group_file or address:
            self.driver = _agree(
                self.comm, "connecting to the group", lambda: _strom.Driver.connect(group_file, address=address)
            )
            return
        master = self._start_servers(max(per_node, 1), data_dir, host, insecure)

        def connect() -> _strom.Driver:
            if self.rank == 0 and self._server is not None:
                return self._server  # rank 0's server holds the registry
            return _strom.Driver.connect(address=master)

        self.driver = _agree(self.comm, "connecting to the group", connect)

    def _start_servers(self, per_node: int, data_dir: Any, host: str, insecure: bool) -> str:
        from mpi4py import MPI

        node = self.comm.Split_type(MPI.COMM_TYPE_SHARED, self.rank)
        is_server = node.rank < per_node
        node.Free()
        nservers = self.comm.allreduce(int(is_server))
        parent = data_dir or os.environ.get("TMPDIR") or "/tmp"

        def start(join: Optional[tuple[str, str]]) -> None:
            self._dir = tempfile.mkdtemp(prefix=f"strom-mpi-{self.rank}-", dir=parent)
            group = os.path.join(self._dir, "group.json")
            kw: dict[str, Any] = {"listen": f"{host}:0", "insecure": insecure}
            if join is None:
                kw["group_file"] = group
            else:
                for path, text in ((group, join[0]), (group + ".secret", join[1])):
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "w") as f:
                        f.write(text)
                kw["join"] = group
            self._server = _strom.Driver.embedded(self._dir, **kw)

        _agree(self.comm, "starting the first server", lambda: start(None) if self.rank == 0 else None)
        files = None
        if self.rank == 0 and nservers > 1:
            group = os.path.join(str(self._dir), "group.json")
            with open(group) as g, open(group + ".secret") as s:
                files = (g.read(), s.read())
        servers = self.comm.Split(0 if is_server else MPI.UNDEFINED, self.rank)
        if servers != MPI.COMM_NULL:
            files = servers.bcast(files, root=0)
            servers.Free()
        _agree(self.comm, "starting the servers", lambda: start(files) if is_server and self.rank != 0 else None)
        _agree(self.comm, "waiting for the servers to join", lambda: self._await_servers(nservers) if self.rank == 0 else None)
        return self.comm.bcast(self._server.address if self.rank == 0 and self._server else None, root=0)

    def _await_servers(self, want: int) -> None:
        deadline = time.monotonic() + _JOIN_WAIT_S
        assert self._server is not None
        while sum(m["alive"] for m in self._server.members()) < want:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {want} servers did not all join within {_JOIN_WAIT_S:.0f} s")
            time.sleep(0.02)

    def _open_topic(
        self, name: str, partitions: Optional[int], type_: str, selector: Optional[str], durability: str
    ) -> None:
        assert self.driver is not None
        parts = partitions or max(self.consumers, 1)

        def create() -> None:
            if self.rank == 0:
                self.driver.create_topic(
                    name, parts, type=type_, selector=selector or "round-robin", durability=durability, exist_ok=True
                )

        _agree(self.comm, "creating the topic", create)
        self.topic = _agree(self.comm, "opening the topic", lambda: self.driver.open_topic(name))
        self.partitions = self.topic.partitions
        self._partition = None if selector else self.producer_index % self.partitions

    def _open_producer(self) -> None:
        if self.producer_index >= 0:
            assert self.topic is not None
            self.producer = self.topic.producer()

    def _open_consumer(self, name: str, distribution: str, data_selector: Any) -> None:
        if self.consumer_index < 0:
            return
        assert self.topic is not None
        mine = [
            p for p in range(self.partitions) if distribution == "broadcast" or p % self.consumers == self.consumer_index
        ]
        if mine:
            self.consumer = self.topic.consumer(f"{name}-{self.consumer_index}", partitions=mine, data_selector=data_selector)

    # ---- streaming --------------------------------------------------------

    def push(self, data: Any = None, metadata: Any = None) -> _strom.PushFuture:
        """Queues one event (a numpy array keeps its dtype and shape); producer ranks only."""
        if self.producer is None:
            raise ValueError("this rank is not a producer of the channel")
        return self.producer.push({} if metadata is None else metadata, data, partition=self._partition)

    def end(self) -> None:
        """Flushes and ends this rank's part of the stream (not collective)."""
        if self.producer is None:
            raise ValueError("this rank is not a producer of the channel")
        if not self._ended:
            self._ended = True
            self.producer.close()

    def pull(self, timeout: Optional[float] = None) -> Optional[_strom.Event]:
        """The next event, or None at the end of the stream; consumer ranks only."""
        if self.consumer_index < 0:
            raise ValueError("this rank is not a consumer of the channel")
        return None if self.consumer is None else self.consumer.pull(timeout)

    def __iter__(self) -> Iterator[_strom.Event]:
        while (ev := self.pull()) is not None:
            yield ev

    def operate(
        self,
        on_event: Callable[[_strom.Event], None],
        on_start: Optional[Callable[[], None]] = None,
        on_end: Optional[Callable[[], None]] = None,
    ) -> None:
        """MPIStream's Operate: on_start, on_event for each event (acked after it
        returns), on_end at the end of the stream."""
        if on_start:
            on_start()
        for ev in self:
            on_event(ev)
            ev.ack()
        if on_end:
            on_end()

    # ---- close ------------------------------------------------------------

    def close(self) -> None:
        """Collective: ends this rank's stream if it has not, waits for every rank,
        stops the embedded servers and removes their directories."""
        if self.comm is None:
            return
        self._teardown()

    def _teardown(self) -> None:
        error = None
        try:
            if self.producer is not None and not self._ended:
                self._ended = True
                self.producer.close()
        except Exception as e:  # noqa: BLE001 - carried to every rank
            error = f"{type(e).__name__}: {e}"
        self.producer = self.consumer = self.topic = None
        self.driver = None
        errors = self.comm.allgather(error)
        if self.rank != 0:
            self._server = None
        self.comm.Barrier()
        self._server = None
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
        self.comm.Free()
        self.comm = None
        for rank, message in enumerate(errors):
            if message is not None:
                raise ChannelError("closing the channel", rank, message)

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
