"""Quotas with a real Kafka client (docs/quotas.md): confluent-kafka
(librdkafka, which speaks Produce v7+ and throttles itself on the
`throttle_time_ms` of an answer, KIP-219) producing to a topic with a
produce quota reports throttling through `throttle_cb`, and is held near
the quota (over many requests: the throttle time of one answer holds the
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


def test_a_kafka_producer_over_its_topic_quota_reports_throttling_and_is_held(tmp_path):
    from confluent_kafka import Producer

    s = KafkaServer(tmp_path)
    try:
        create_topic(s.broker, "q", 1)
        subprocess.run(
            [strom_bin(), "--address", s.native, "quota", "set", "--topic", "q",
             "--produce-bytes-per-sec", str(QUOTA)],
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
    finally:
        s.stop()
