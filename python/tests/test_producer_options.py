"""Producer batching options from Python: one event-size cap
(`max_event_bytes`) refused at push, and batch sizes in bytes that shape
what reaches the server."""

from __future__ import annotations

import pytest

import strom


def test_max_event_bytes_refuses_a_larger_event_at_push(driver):
    t = driver.create_topic("capped", partitions=1)
    p = t.producer(max_event_bytes=4096)
    p.push({"i": 0}, bytes(1000)).result()
    with pytest.raises(strom.StromError) as refused:
        p.push({"i": 1}, bytes(8192))
    assert refused.value.code == 305  # BATCH_TOO_LARGE
    assert "max_event_bytes" in str(refused.value)
    p.close()
    # Only the event that fit was stored.
    assert driver.describe("capped")["partitions"][0]["next_offset"] == 1


def test_max_event_bytes_must_be_positive(driver):
    t = driver.create_topic("zero", partitions=1)
    with pytest.raises(strom.StromError):
        t.producer(max_event_bytes=0)


@pytest.mark.parametrize(
    "options",
    [
        {"batch_bytes": 4096},
        {"batch": 3, "batch_bytes": 4096},
        {"batch": "adaptive", "max_batch_bytes": 4096},
    ],
)
def test_byte_sized_batches_deliver_every_event_in_order(driver, options):
    t = driver.create_topic("sized", partitions=1, exist_ok=True)
    with t.producer(linger=0.001, **options) as p:
        futures = [p.push({"i": i}, bytes(1500)) for i in range(20)]
        offsets = [f.result().offset for f in futures]
    assert offsets == sorted(offsets) and len(set(offsets)) == 20


def test_pull_batch_takes_what_has_arrived_and_none_at_the_end(driver):
    t = driver.create_topic("batchpull", partitions=1)
    # One stored batch of ten, so all ten arrive together: with adaptive
    # batching the first event may go alone, and a pull taken right when
    # it arrives would rightly return just that one.
    p = t.producer(batch=10)
    for f in [p.push({"task": i}) for i in range(10)]:
        f.result()
    c = t.consumer("workers")
    first = c.pull_batch(4, timeout=10)
    assert [e.offset for e in first] == [0, 1, 2, 3]
    rest = []
    while len(rest) < 6:
        rest += c.pull_batch(100, timeout=10)
    assert [e.offset for e in rest] == list(range(4, 10))
    assert c.pull_batch(10, timeout=0) == []  # drains without waiting, no error
    assert c.pull_batch(10, timeout=0.1) == []
    with pytest.raises(strom.StromError):
        c.pull_batch(0)
    p.close()
    assert c.pull_batch(10, timeout=10) is None


def test_a_linger_or_lease_beyond_any_duration_is_refused(driver):
    t = driver.create_topic("long", partitions=1)
    with pytest.raises(strom.InvalidArgument):
        t.producer(linger=1e300)
    with pytest.raises(strom.InvalidArgument):
        t.producer(lease=1e300)
