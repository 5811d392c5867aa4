"""Quotas with a real Kafka client (docs/quotas.md): confluent-kafka
(librdkafka, which speaks Produce v7+ and Fetch v11 and throttles itself
on the `throttle_time_ms` of an answer, KIP-219) producing to a topic with
a produce quota, and consuming one with a consume quota, reports
throttling through `throttle_cb`, and is held near the quota (over many requests: the throttle time of one answer holds the
next request, never the answer itself). A real `strom server` process with
a Kafka listener."""

from __future__ import annotations

import subprocess
import time

import pytest

pytest.importorskip("confluent_kafka")

from test_kafka import KafkaServer, create_topic, strom_bin  # noqa: E402

QUOTA = 256 << 10
VALUE = b"q" * (32 << 10)


def test_kafka_clients_over_their_topic_quotas_report_throttling_and_are_held(tmp_path):
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    s = KafkaServer(tmp_path)
    try:
        create_topic(s.broker, "q", 1)
        create_topic(s.broker, "c", 1)
        for args in (["--topic", "q", "--produce-bytes-per-sec", str(QUOTA)],
                     ["--topic", "c", "--consume-bytes-per-sec", str(QUOTA)]):
            subprocess.run([strom_bin(), "--address", s.native, "quota", "set", *args],
                           check=True, timeout=30, capture_output=True)
        throttles = []
        p = Producer({
            "bootstrap.servers": s.broker,
            "linger.ms": 5,
            # Requests of at most two records: the throttle of an answer
            # holds the next request (KIP-219), so the rate is held over
            # many requests, not within one.
            "batch.size": 2 * len(VALUE) + 1024,
            "throttle_cb": lambda ev: throttles.append(ev.throttle_time),
        })
        # The server reads the new quota within acl_refresh_ms: produce
        # until an answer reports a throttle time.
        deadline = time.monotonic() + 30
        while not [t for t in throttles if t > 0]:
            assert time.monotonic() < deadline, "no answer reported a throttle time"
            p.produce("q", VALUE)
            p.flush(30)
        # From then on the client is held near the quota.
        start = time.monotonic()
        sent = 0
        while sent < 3 * QUOTA:
            p.produce("q", VALUE)
            p.poll(0)
            sent += len(VALUE)
        assert p.flush(60) == 0, "every record acknowledged"
        rate = sent / (time.monotonic() - start)
        print(f"confluent-kafka producer: {rate / 1024:.0f} KiB/s under a quota of "
              f"{QUOTA / 1024:.0f} KiB/s; throttle times (s): {throttles[:8]}")
        assert rate < QUOTA * 1.25, f"{rate:.0f} B/s is far above the quota of {QUOTA}"
        assert max(throttles) > 0
        # The consume quota of `c` (in force with the produce quota above):
        # a consumer is told to back off and is held near it too.
        for _ in range(3 * QUOTA // len(VALUE)):
            p.produce("c", VALUE)
        assert p.flush(60) == 0
        read_throttles = []
        c = Consumer({
            "bootstrap.servers": s.broker,
            "group.id": "unused",
            "enable.auto.commit": False,
            # Answers of at most two records, so the rate is held over
            # many fetches.
            "message.max.bytes": 2 * len(VALUE) + 1024,
            "fetch.max.bytes": 2 * len(VALUE) + 1024,
            "max.partition.fetch.bytes": 2 * len(VALUE) + 1024,
            "throttle_cb": lambda ev: read_throttles.append(ev.throttle_time),
        })
        c.assign([TopicPartition("c", 0, OFFSET_BEGINNING)])
        start = time.monotonic()
        got = 0
        while got < 3 * QUOTA:
            m = c.poll(1.0)
            assert time.monotonic() - start < 60, "consuming took too long"
            if m is not None:
                assert m.error() is None, m.error()
                got += len(m.value())
        rate = got / (time.monotonic() - start)
        c.close()
        print(f"confluent-kafka consumer: {rate / 1024:.0f} KiB/s under a quota of "
              f"{QUOTA / 1024:.0f} KiB/s; throttle times (s): {read_throttles[:8]}")
        assert [t for t in read_throttles if t > 0], "no fetch answer reported a throttle time"
        assert rate < QUOTA * 1.25, f"{rate:.0f} B/s is far above the quota of {QUOTA}"
    finally:
        s.stop()
