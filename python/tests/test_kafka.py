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
    """A `strom server` with a Kafka listener; `.broker` is its address."""

    def __init__(self, base: pathlib.Path):
        self.proc = subprocess.Popen(
            [strom_bin(), "server", "--data-dir", str(base / "data"),
             "--listen", "127.0.0.1:0", "--kafka-listen", "127.0.0.1:0"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        found = threading.Event()
        self.broker = ""

        def read():
            for line in self.proc.stderr:
                self.lines.append(line)
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


@pytest.fixture
def kafka(tmp_path):
    s = KafkaServer(tmp_path)
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
