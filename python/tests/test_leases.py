"""Producer leases from Python: renewals run on the client's Rust threads,
so a producer stays alive while Python holds the GIL in a busy loop."""

from __future__ import annotations

import time

import pytest

import strom

LEASE = 1.0  # seconds: the shortest lease a server grants


def test_renewals_survive_a_busy_gil(driver):
    t = driver.create_topic("busy", partitions=1)
    p = t.producer(lease=LEASE)
    p.push({"n": 1}).wait()
    # A pure-Python loop that never releases the GIL on its own, for more
    # than three lease periods.
    end = time.monotonic() + 3.5 * LEASE
    spins = 0
    while time.monotonic() < end:
        spins += 1
    state = t.describe()["state"]
    assert state["open_producers"] == 1, state
    assert state["expired_producers"] == 0, state
    assert not state["ended"], state
    c = t.consumer("c")
    assert c.pull(timeout=5.0) is not None
    with pytest.raises(strom.TimeoutError):
        c.pull(timeout=0.3)  # the stream is still open
    p.push({"n": 2})
    p.close()
    assert c.pull(timeout=5.0) is not None
    assert c.pull(timeout=5.0) is None
    assert t.describe()["state"]["expired_producers"] == 0


def test_a_dropped_leased_producer_expires(driver):
    t = driver.create_topic("dropped", partitions=1)
    p = t.producer(lease=LEASE)
    p.push({"n": 1}).wait()
    del p  # never closed: its renewals stop
    c = t.consumer("c")
    assert c.pull(timeout=5.0) is not None
    assert c.pull(timeout=10 * LEASE) is None, "the lease expired, the stream ended"
    state = t.describe()["state"]
    assert (state["closed_producers"], state["expired_producers"]) == (0, 1), state


def test_lease_none_never_expires(driver):
    t = driver.create_topic("kept", partitions=1)
    p = t.producer(lease=None)
    p.push({"n": 1}).wait()
    del p
    time.sleep(2.5 * LEASE)
    state = t.describe()["state"]
    assert state["open_producers"] == 1 and not state["ended"], state
