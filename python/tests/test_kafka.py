"""Strom's Kafka front end with Python's Kafka clients: confluent-kafka
(librdkafka) creates a topic, produces with its idempotent producer and lz4,
and reads everything back from assigned partitions; kafka-python lists
topics and finds offsets by timestamp. A real `strom server` process with
`--kafka-listen 127.0.0.1:0` (docs/kafka.md)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import threading
import time

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")

REPO = pathlib.Path(__file__).resolve().parents[2]


def strom_bin() -> str:
    return os.environ.get("STROM_BIN", str(REPO / "target" / "debug" / "strom"))


class KafkaServer:
    """A `strom server` with a Kafka listener; `.broker` is its address.
    `args` go on its command line."""

    def __init__(self, base: pathlib.Path, *args: str):
        self.data_dir = base / "data"
        self.proc = subprocess.Popen(
            [strom_bin(), "server", "--data-dir", str(base / "data"),
             "--listen", "127.0.0.1:0", "--kafka-listen", "127.0.0.1:0", *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        found = threading.Event()
        self.broker = ""
        self.native = ""

        def read():
            for line in self.proc.stderr:
                self.lines.append(line)
                if line.startswith("strom server listening on "):
                    self.native = line.split()[4]
                if line.startswith("strom kafka listening on "):
                    self.broker = line.split()[-1]
                    found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(15):
            self.stop()
            raise AssertionError("no Kafka address printed:\n" + "".join(self.lines))

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# The first rebalance of a new group waits 3 s by default, for more members
# (docs/kafka.md); the tests below that are not about that wait skip it.
NO_INITIAL_DELAY = ("--kafka-group-initial-rebalance-delay-ms", "0")


@pytest.fixture
def kafka(tmp_path):
    s = KafkaServer(tmp_path, *NO_INITIAL_DELAY)
    yield s
    s.stop()


def create_topic(broker: str, name: str, partitions: int):
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    futures[name].result(timeout=30)
    meta = admin.list_topics(timeout=30)
    assert len(meta.topics[name].partitions) == partitions


def read_partitions(broker: str, topic: str, partitions: int, want: int) -> list:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({
        "bootstrap.servers": broker,
        "group.id": "unused",  # required by the client; no group protocol is used
        "enable.auto.commit": False,
        "enable.partition.eof": False,
    })
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    out = []
    deadline = time.monotonic() + 60
    while len(out) < want and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is None:
            continue
        assert m.error() is None, m.error()
        out.append(m)
    c.close()
    return out


def test_confluent_kafka_idempotent_lz4_producer_and_reader(kafka):
    create_topic(kafka.broker, "py", 4)
    from confluent_kafka import Producer

    p = Producer({
        "bootstrap.servers": kafka.broker,
        "enable.idempotence": True,
        "compression.type": "lz4",
        "linger.ms": 5,
    })
    acked = []

    def on_delivery(err, msg):
        assert err is None, err
        acked.append((msg.partition(), msg.offset()))

    n = 2000
    for i in range(n):
        p.produce("py", key=f"k{i % 13}", value=b"v%d-" % i + bytes(i % 251),
                  headers=[("i", str(i).encode())], on_delivery=on_delivery)
        p.poll(0)
    assert p.flush(60) == 0
    assert len(acked) == n

    got = read_partitions(kafka.broker, "py", 4, n)
    assert len(got) == n
    by_i = {int(dict(m.headers())["i"]): m for m in got}
    assert sorted(by_i) == list(range(n))
    for i, m in by_i.items():
        assert m.key() == f"k{i % 13}".encode()
        assert m.value() == b"v%d-" % i + bytes(i % 251)
    # Offsets are those the producer was told, dense per partition, and a
    # key's records keep their order.
    assert sorted((m.partition(), m.offset()) for m in got) == sorted(acked)
    per_key: dict[bytes, list[int]] = {}
    for m in sorted(got, key=lambda m: (m.partition(), m.offset())):
        per_key.setdefault(m.key(), []).append(int(dict(m.headers())["i"]))
    for seq in per_key.values():
        assert seq == sorted(seq)


def test_kafka_python_lists_topics_and_finds_offsets_by_timestamp(kafka):
    kafka_mod = pytest.importorskip("kafka")
    create_topic(kafka.broker, "times", 1)
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": kafka.broker})
    for i in range(5):
        p.produce("times", value=b"early-%d" % i)
    assert p.flush(30) == 0
    time.sleep(0.2)
    cut_ms = int(time.time() * 1000)
    time.sleep(0.2)
    for i in range(5):
        p.produce("times", value=b"late-%d" % i)
    assert p.flush(30) == 0

    c = kafka_mod.KafkaConsumer(bootstrap_servers=kafka.broker)
    assert "times" in c.topics()
    tp = kafka_mod.TopicPartition("times", 0)
    found = c.offsets_for_times({tp: cut_ms})[tp]
    assert found is not None and found.offset == 5
    assert c.beginning_offsets([tp])[tp] == 0
    assert c.end_offsets([tp])[tp] == 10
    assert c.offsets_for_times({tp: int(time.time() * 1000) + 60_000})[tp] is None
    c.close()


def group_consumer(broker: str, group: str, strategy: str = "range,roundrobin"):
    from confluent_kafka import Consumer

    return Consumer({
        "bootstrap.servers": broker,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        "partition.assignment.strategy": strategy,
    })


def poll_until(consumers, cond, timeout=60.0, sink=None):
    """Polls every consumer until `cond()` holds; messages go to `sink`."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        for c in consumers:
            m = c.poll(0.1)
            if m is not None:
                assert m.error() is None, m.error()
                if sink is not None:
                    sink.setdefault(id(c), []).append(m)


def test_confluent_kafka_group_splits_partitions_rebalances_and_resumes(kafka):
    create_topic(kafka.broker, "grp", 4)
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": kafka.broker})

    def produce(start, n):
        for i in range(start, start + n):
            p.produce("grp", value=b"%d" % i, partition=i % 4)
        assert p.flush(30) == 0

    a = group_consumer(kafka.broker, "workers")
    b = group_consumer(kafka.broker, "workers")
    a.subscribe(["grp"])
    b.subscribe(["grp"])
    # Two members split the four partitions.
    poll_until([a, b], lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2)
    parts_a = {tp.partition for tp in a.assignment()}
    parts_b = {tp.partition for tp in b.assignment()}
    assert parts_a | parts_b == {0, 1, 2, 3} and not parts_a & parts_b

    produce(0, 400)
    got: dict = {}
    poll_until([a, b], lambda: sum(len(v) for v in got.values()) >= 400, sink=got)
    for c, parts in ((a, parts_a), (b, parts_b)):
        msgs = got.get(id(c), [])
        assert {m.partition() for m in msgs} <= parts, "each reads only its partitions"
    values = sorted(int(m.value()) for v in got.values() for m in v)
    assert values == list(range(400)), "every message once"
    a.commit(asynchronous=False)
    b.commit(asynchronous=False)

    # One leaves: the other takes its partitions over, from the committed
    # offsets (nothing read twice).
    b.close()
    poll_until([a], lambda: len(a.assignment()) == 4)
    produce(400, 100)
    got = {}
    poll_until([a], lambda: len(got.get(id(a), [])) >= 100, sink=got)
    assert sorted(int(m.value()) for m in got[id(a)]) == list(range(400, 500))
    a.commit(asynchronous=False)
    a.close()

    # A restarted member resumes after the committed offsets.
    produce(500, 20)
    c = group_consumer(kafka.broker, "workers")
    c.subscribe(["grp"])
    got = {}
    poll_until([c], lambda: len(got.get(id(c), [])) >= 20, sink=got)
    quiet_until = time.monotonic() + 1.0
    poll_until([c], lambda: time.monotonic() > quiet_until, sink=got)
    assert sorted(int(m.value()) for m in got[id(c)]) == list(range(500, 520))
    c.close()


@pytest.mark.parametrize("strategy", ["roundrobin", "cooperative-sticky"])
def test_other_assignors_split_and_hand_over_partitions(kafka, strategy):
    """The client-side assignors besides range (the default, above): two
    members split four partitions, every message is read once, and when one
    leaves the other ends up with all four, incrementally for
    cooperative-sticky."""
    topic = "assign-" + strategy
    create_topic(kafka.broker, topic, 4)
    from confluent_kafka import Producer

    a = group_consumer(kafka.broker, "g-" + strategy, strategy)
    b = group_consumer(kafka.broker, "g-" + strategy, strategy)
    a.subscribe([topic])
    b.subscribe([topic])
    # Split first (nothing committed yet, so messages read before the split
    # would legitimately be read again by the new owner).
    poll_until([a, b], lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2)
    p = Producer({"bootstrap.servers": kafka.broker})
    for i in range(200):
        p.produce(topic, value=b"%d" % i, partition=i % 4)
    assert p.flush(30) == 0
    got: dict = {}
    poll_until([a, b], lambda: sum(len(v) for v in got.values()) >= 200, sink=got)
    parts_a = {tp.partition for tp in a.assignment()}
    parts_b = {tp.partition for tp in b.assignment()}
    assert parts_a | parts_b == {0, 1, 2, 3} and not parts_a & parts_b
    values = sorted(int(m.value()) for v in got.values() for m in v)
    assert values == list(range(200)), "every message once"
    a.commit(asynchronous=False)
    b.commit(asynchronous=False)
    b.close()
    poll_until([a], lambda: len(a.assignment()) == 4)
    a.close()


def test_a_killed_member_s_partitions_go_to_the_survivor(kafka, tmp_path):
    create_topic(kafka.broker, "kill", 4)
    script = tmp_path / "member.py"
    script.write_text(
        "import sys\n"
        "from confluent_kafka import Consumer\n"
        "c = Consumer({'bootstrap.servers': sys.argv[1], 'group.id': 'survive',\n"
        "              'session.timeout.ms': 6000, 'heartbeat.interval.ms': 500})\n"
        "c.subscribe(['kill'])\n"
        "while True:\n"
        "    c.poll(0.1)\n")
    import sys

    other = subprocess.Popen([sys.executable, str(script), kafka.broker])
    try:
        a = group_consumer(kafka.broker, "survive")
        a.subscribe(["kill"])
        poll_until([a], lambda: len(a.assignment()) == 2)
        other.kill()
        other.wait()
        # The killed member's session (6 s) runs out; the survivor rejoins
        # and takes all four partitions.
        poll_until([a], lambda: len(a.assignment()) == 4, timeout=30)
        a.close()
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()


def test_admin_clients_list_and_describe_kafka_groups(kafka):
    create_topic(kafka.broker, "desc", 2)
    from confluent_kafka.admin import AdminClient

    c = group_consumer(kafka.broker, "described")
    c.subscribe(["desc"])
    poll_until([c], lambda: len(c.assignment()) == 2)
    admin = AdminClient({"bootstrap.servers": kafka.broker})
    listed = admin.list_consumer_groups().result(timeout=30)
    assert "described" in [g.group_id for g in listed.valid]
    desc = admin.describe_consumer_groups(["described"])["described"].result(timeout=30)
    assert len(desc.members) == 1
    assert {tp.partition for tp in desc.members[0].assignment.topic_partitions} == {0, 1}
    kafka_mod = pytest.importorskip("kafka")
    ka = kafka_mod.KafkaAdminClient(bootstrap_servers=kafka.broker)
    # kafka-python 2.x: list_consumer_groups(); 3.x: list_groups().
    lister = getattr(ka, "list_consumer_groups", None) or ka.list_groups
    assert "described" in str(lister())
    ka.close()
    c.close()


def test_strom_and_confluent_kafka_read_each_other_s_events(kafka):
    """Cross-surface: events pushed with Strom's Python client are read by
    confluent-kafka (data as the value, metadata in the `strom.meta`
    header), and records produced by confluent-kafka are read by Strom's
    consumer (value as the data; key and headers in the metadata)."""
    import json

    import numpy as np
    import strom
    from confluent_kafka import Producer

    d = strom.Driver.connect(address=kafka.native)
    t = d.create_topic("cross", partitions=1, type="memory")
    arrays = [np.arange(i, i + 64, dtype="<u4") for i in range(20)]
    with t.producer() as p:
        for i, a in enumerate(arrays):
            p.push({"i": i, "src": "strom"}, a)
    got = read_partitions(kafka.broker, "cross", 1, 20)
    assert len(got) == 20
    for m in got:
        meta = json.loads(dict(m.headers())["strom.meta"])
        assert meta["src"] == "strom"
        assert m.value() == arrays[meta["i"]].tobytes()
    assert [json.loads(dict(m.headers())["strom.meta"])["i"] for m in got] == list(range(20))

    create_topic(kafka.broker, "cross2", 1)
    pr = Producer({"bootstrap.servers": kafka.broker, "enable.idempotence": True})
    for i in range(20):
        pr.produce("cross2", key=f"k{i}", value=b"kafka-%d" % i, headers=[("n", str(i).encode())])
    assert pr.flush(60) == 0
    c = d.open_topic("cross2").consumer("reader", start="beginning")
    seen = []
    while len(seen) < 20:
        batch = c.pull_batch(64, timeout=30)
        assert batch, f"no event after {len(seen)}"
        seen.extend(batch)
    for i, ev in enumerate(seen):
        assert bytes(ev.data) == b"kafka-%d" % i
        k = ev.metadata["kafka"]
        assert k["key"] == f"k{i}"
        assert ["n", str(i)] in k["headers"]
    c.close()
