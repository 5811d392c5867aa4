"""Kafka consumer groups behave as against Apache Kafka (issue 34), with
confluent-kafka (librdkafka) against a real `strom server` process:

- consumers of a new group started together share the partitions from the
  first generation (the first rebalance waits
  `kafka_group_initial_rebalance_delay_ms`, 3 s by default, as Kafka's
  `group.initial.rebalance.delay.ms`);
- static members (`group.instance.id`) that closed, as static members do,
  without leaving the group are given their partitions back at once when
  they restart, and resume from the committed offsets, instead of waiting
  for the old incarnation's session to run out (docs/kafka.md)."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("confluent_kafka")

from test_kafka import NO_INITIAL_DELAY, KafkaServer, create_topic, poll_until  # noqa: E402


def produce(broker: str, topic: str, start: int, n: int, partitions: int = 4):
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": broker})
    for i in range(start, start + n):
        p.produce(topic, value=b"%d" % i, partition=i % partitions)
    assert p.flush(30) == 0


def member(broker: str, group: str, **extra):
    from confluent_kafka import Consumer

    conf = {
        "bootstrap.servers": broker,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
    }
    conf.update(extra)
    return Consumer(conf)


def subscribe_recording(c, topic: str) -> list:
    """Subscribes `c`; the returned list receives the set of partitions of
    each assignment it is handed."""
    history: list = []
    c.subscribe([topic], on_assign=lambda _c, ps: history.append({p.partition for p in ps}))
    return history


def values(msgs) -> list:
    return sorted(int(m.value()) for m in msgs)


def test_consumers_started_together_share_the_partitions_from_the_first_generation(tmp_path):
    server = KafkaServer(tmp_path)  # the default initial delay
    try:
        broker = server.broker
        create_topic(broker, "together", 4)
        produce(broker, "together", 0, 200)
        a = member(broker, "starters")
        b = member(broker, "starters")
        hist_a = subscribe_recording(a, "together")
        got: dict = {}
        # The second starts half a second after the first, which runs
        # meanwhile: without the wait, the first is handed all four
        # partitions at once and reads everything before the second is
        # assigned any.
        second_starts = time.monotonic() + 0.5
        poll_until([a], lambda: time.monotonic() > second_starts, sink=got)
        hist_b = subscribe_recording(b, "together")
        poll_until([a, b], lambda: sum(len(v) for v in got.values()) >= 200, sink=got)
        assert len(hist_a[0]) == 2 and len(hist_b[0]) == 2, (hist_a, hist_b)
        assert hist_a[0] | hist_b[0] == {0, 1, 2, 3}
        for c, parts in ((a, hist_a[0]), (b, hist_b[0])):
            mine = got.get(id(c), [])
            assert mine, "each member reads some events"
            assert {m.partition() for m in mine} == parts
        assert values(m for v in got.values() for m in v) == list(range(200)), "every event once"
        a.close()
        b.close()
    finally:
        server.stop()


def test_restarted_static_members_get_their_partitions_at_once_and_resume(tmp_path):
    server = KafkaServer(tmp_path, *NO_INITIAL_DELAY)
    try:
        broker = server.broker
        create_topic(broker, "static", 4)
        # A long session, as static members use: it must not be what ends
        # the wait when they come back.
        static = {"session.timeout.ms": 30000}
        first = [member(broker, "statics", **{"group.instance.id": f"i{j}"}, **static)
                 for j in range(2)]
        for c in first:
            c.subscribe(["static"])
        poll_until(first, lambda: all(len(c.assignment()) == 2 for c in first))
        produce(broker, "static", 0, 200)
        got: dict = {}
        poll_until(first, lambda: sum(len(v) for v in got.values()) >= 200, sink=got)
        assert values(m for v in got.values() for m in v) == list(range(200))
        for c in first:
            c.commit(asynchronous=False)
            # A static member does not leave the group when it closes.
            c.close()
        produce(broker, "static", 200, 100)

        again = [member(broker, "statics", **{"group.instance.id": f"i{j}"}, **static)
                 for j in range(2)]
        for c in again:
            c.subscribe(["static"])
        # Promptly: well before the old sessions (30 s) run out.
        got = {}
        poll_until(again, lambda: sum(len(v) for v in got.values()) >= 100, sink=got, timeout=10)
        parts = [{tp.partition for tp in c.assignment()} for c in again]
        assert parts[0] | parts[1] == {0, 1, 2, 3} and not parts[0] & parts[1], parts
        quiet_until = time.monotonic() + 1.0
        poll_until(again, lambda: time.monotonic() > quiet_until, sink=got)
        # From the committed offsets: the new events only, each once, each
        # read by the member holding its partition.
        assert values(m for v in got.values() for m in v) == list(range(200, 300))
        for c, mine in zip(again, parts):
            assert {m.partition() for m in got.get(id(c), [])} <= mine
        for c in again:
            c.close()
    finally:
        server.stop()
