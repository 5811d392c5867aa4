"""Many events per call: `Producer.push_many` queues a list of events with
one crossing into Rust (and one GIL release), `Consumer.pull_many` waits
for `n` events and returns them in one list. Order, content, descriptors,
what an error in the middle of a call leaves behind, and the GIL."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import numpy as np
import pytest

import strom
from conftest import drain


def expected_descriptor(a: np.ndarray) -> dict:
    order = "F" if a.ndim > 1 and a.flags.f_contiguous and not a.flags.c_contiguous else "C"
    return {"dtype": a.dtype.str, "shape": list(a.shape), "order": order}


def arrays_of_every_kind() -> list[np.ndarray]:
    out = []
    for code in "?bBhHiIlLqQnNpPefdgFDG":
        out.append(np.arange(6).astype(code).reshape(2, 3))
    for code in (">i2", ">u4", ">f8", ">c16", ">f2", "<i8", "=u2"):
        out.append(np.arange(5).astype(code))
    out += [
        np.array([b"ab", b"cde"], dtype="S5"),  # not a numeric format: dtype.str
        np.array(["xy", "z"], dtype="U3"),
        np.zeros(3, dtype="i2,f4"),  # a record: |V6
        np.array(2.5),  # 0-d
        np.zeros((0, 4), dtype="<u2"),  # no elements
        np.asfortranarray(np.arange(12, dtype="<f4").reshape(3, 4)),
        np.arange(8, dtype="<i4")[:, None],  # a length-1 axis: still C
        np.arange(24, dtype="<f8").reshape(2, 3, 4).transpose(2, 1, 0),  # F by strides
    ]
    ro = np.arange(7, dtype="<u8")
    ro.flags.writeable = False  # read-only arrays are lent too
    out.append(ro)
    return out


def test_push_many_keeps_order_content_and_shared_metadata(driver, ptype):
    t = driver.create_topic("order", 1, type=ptype)
    sizes = [1, 1024, 7, 65536, 0, 4096, 3] * 5
    arrays = [np.full(n, i, dtype="<u1") for i, n in enumerate(sizes)]
    with t.producer() as p:
        ids = p.push_many(arrays, metadata={"run": 7}).wait(30)
    assert [i.offset for i in ids] == list(range(len(arrays)))
    events = drain(t.consumer("c"))
    assert [e.offset for e in events] == list(range(len(arrays)))
    for e, a in zip(events, arrays):
        assert e.metadata == {"run": 7}
        assert e.data.dtype == a.dtype and e.data.shape == a.shape
        assert np.array_equal(e.data, a)


def test_push_many_pairs_carry_their_own_metadata_and_any_data(driver):
    t = driver.create_topic("pairs", 1, type="memory")
    items = [
        ({"i": 0}, b"bytes"),
        ({"i": 1}, bytearray(b"bytearray")),
        ('{"i": 2}', memoryview(b"view")),
        (b'{"i": 3}', None),
        ({"i": 4}, [b"two ", b"segments"]),
        ({"i": 5}, np.arange(3, dtype="<i4")),
    ]
    with t.producer() as p:
        p.push_many(iter(items)).wait(30)  # any iterable
    events = drain(t.consumer("c"))
    assert [e.metadata["i"] for e in events] == list(range(6))
    assert bytes(events[0].data) == b"bytes"
    assert bytes(events[1].data) == b"bytearray"
    assert bytes(events[2].data) == b"view"
    assert events[3].data_size == 0
    assert bytes(events[4].data) == b"two segments"
    assert events[5].data.tolist() == [0, 1, 2]


@pytest.mark.parametrize("many", [False, True], ids=["push", "push_many"])
def test_descriptors_match_numpy_for_every_kind_of_array(driver, many):
    t = driver.create_topic("kinds", 1, type="memory")
    arrays = arrays_of_every_kind()
    with t.producer() as p:
        if many:
            p.push_many(arrays, metadata={})
        else:
            for a in arrays:
                p.push({}, a)
    events = drain(t.consumer("c"))
    assert len(events) == len(arrays)
    for e, a in zip(events, arrays):
        assert json.loads(e.descriptor) == expected_descriptor(a), a.dtype
        got = e.data
        assert isinstance(got, np.ndarray)
        # a record comes back as plain bytes of its size (|V6), as it always has
        assert got.dtype.str == a.dtype.str and got.shape == a.shape, a.dtype
        assert got.tobytes(order="A") == a.tobytes(order="A"), a.dtype


def test_the_same_layout_from_the_cache_keeps_each_arrays_own_shape(driver):
    # Cached descriptors are keyed by format, item size, order and shape.
    t = driver.create_topic("cache", 1, type="memory")
    arrays = [np.zeros((4, 4), "<f4"), np.zeros((4, 4), "<f4").T, np.zeros((2, 8), "<f4"),
              np.zeros((4, 4), "<i4"), np.zeros((4, 4), ">f4"), np.zeros((4, 4), "<f4")] * 3
    with t.producer() as p:
        p.push_many(arrays, metadata={})
        for a in arrays:
            p.push({}, a)
    events = drain(t.consumer("c"))
    for e, a in zip(events, arrays + arrays):
        assert json.loads(e.descriptor) == expected_descriptor(a)
        assert e.data.dtype == a.dtype and e.data.shape == a.shape
        assert e.data.flags.f_contiguous == a.flags.f_contiguous


def test_a_conversion_error_queues_nothing_and_names_the_event(driver):
    t = driver.create_topic("refused", 1, type="memory")
    p = t.producer()
    ok = np.arange(10, dtype="<f8")
    strided = np.arange(100).reshape(10, 10)[:, ::2]
    with pytest.raises(ValueError, match="ascontiguousarray") as err:
        p.push_many([ok, strided, ok], metadata={})
    assert len(err.value.queued) == 0
    assert "event 1 of this push_many call" in " ".join(err.value.__notes__)
    with pytest.raises(TypeError) as err:
        p.push_many([({}, ok), ({}, 12345)])  # not bytes-like
    assert len(err.value.queued) == 0
    with pytest.raises(TypeError, match="pairs"):
        p.push_many([ok])  # without metadata=, items are (metadata, data)
    with pytest.raises(TypeError):
        p.push_many([np.array([object()])], metadata={})  # no byte layout
    p.push_many([ok], metadata={"last": True})
    p.close()
    events = drain(t.consumer("c"))
    assert [e.metadata for e in events] == [{"last": True}]


def test_an_error_while_queuing_keeps_the_events_before_it(driver):
    t = driver.create_topic("capped", 1, type="memory")
    p = t.producer(max_event_bytes=4096)
    small = [bytes([i]) * 100 for i in range(4)]
    with pytest.raises(strom.StromError) as err:
        p.push_many([small[0], small[1], bytes(8192), small[2]], metadata={})
    assert err.value.code == 305  # BATCH_TOO_LARGE
    assert "event 2 of this push_many call" in " ".join(err.value.__notes__)
    queued = err.value.queued
    assert len(queued) == 2
    assert [i.offset for i in queued.wait(30)] == [0, 1]
    p.close()
    assert [bytes(e.data) for e in drain(t.consumer("c"))] == small[:2]


def test_metadata_the_validator_refuses_stops_the_call_there(driver):
    t = driver.create_topic("valid", 1, type="memory", validator="json")
    p = t.producer()
    with pytest.raises(strom.InvalidMetadata) as err:
        p.push_many([({"i": 0}, b"a"), (b'{"i": 1}', b"b"), (b"not json", b"c"), ({"i": 3}, b"d")])
    assert len(err.value.queued) == 2
    p.close()
    assert [e.metadata["i"] for e in drain(t.consumer("c"))] == [0, 1]


def test_an_empty_list_queues_nothing(driver):
    t = driver.create_topic("empty", 1, type="memory")
    with t.producer() as p:
        futs = p.push_many([], metadata={})
        assert len(futs) == 0 and futs.done() and futs.wait(1) == []
        assert p.push_many(()).wait(1) == []
    assert drain(t.consumer("c")) == []


def test_push_futures_give_each_events_id_and_can_be_awaited(driver):
    t = driver.create_topic("futs", 2, type="memory", selector="explicit")
    p = t.producer()
    futs = p.push_many([b"x"] * 5, metadata={}, partition=1)
    ids = futs.wait(30)
    assert [(i.partition, i.offset) for i in ids] == [(1, k) for k in range(5)]
    assert futs.done() and len(futs) == 5
    assert [futs[k].wait(1) for k in range(5)] == ids
    assert futs[-1].result(1) == ids[-1]
    with pytest.raises(IndexError):
        futs[5]
    assert asyncio.run(_awaited(p.push_many([b"y"] * 3, metadata={}, partition=1))) == [
        strom.EventId(1, k) for k in (5, 6, 7)
    ]
    p.close()


async def _awaited(futs):
    return await futs


def test_pull_many_waits_for_n_events_then_returns_the_tail_at_the_end(driver, ptype):
    t = driver.create_topic("pm", 1, type=ptype)
    p = t.producer()
    p.push_many([np.full(4, i, "<i8") for i in range(10)], metadata={}).wait(30)
    c = t.consumer("c")
    first = c.pull_many(4, timeout=30)
    second = c.pull_many(4, timeout=30)
    t0 = time.monotonic()
    tail = c.pull_many(4, timeout=0.5)  # only 2 more exist: the timeout ends the wait
    assert time.monotonic() - t0 >= 0.4
    assert [len(first), len(second), len(tail)] == [4, 4, 2]
    assert [int(e.data[0]) for e in first + second + tail] == list(range(10))
    assert c.pull_many(4, timeout=0) == []
    p.push_many([np.full(4, 10 + i, "<i8") for i in range(3)], metadata={})
    p.close()
    rest = c.pull_many(4, timeout=30)  # the stream ends after 3
    assert [int(e.data[0]) for e in rest] == [10, 11, 12]
    assert c.pull_many(4, timeout=30) is None
    assert c.pull_many(4, timeout=30) is None


def test_pull_many_refuses_n_zero_and_a_negative_timeout(driver):
    c = driver.create_topic("args", 1, type="memory").consumer("c")
    with pytest.raises(strom.InvalidArgument):
        c.pull_many(0)
    with pytest.raises(strom.InvalidArgument):
        c.pull_many(1, timeout=-1)


def test_pull_many_releases_the_gil_while_it_waits(driver):
    t = driver.create_topic("gil", 1, type="memory")
    p = t.producer()
    c = t.consumer("c")
    count, stop = [0], threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1

    th = threading.Thread(target=spin)
    th.start()
    try:
        time.sleep(0.05)
        before = count[0]
        t0 = time.monotonic()
        assert c.pull_many(3, timeout=1.0) == []
        waited = time.monotonic() - t0
        progress = count[0] - before
    finally:
        stop.set()
        th.join()
    assert waited >= 0.9
    # Holding the GIL for that second would leave the thread a few switch
    # intervals (5 ms each) at most; released, it runs the whole time.
    assert progress > 100_000, progress
    p.close()


def test_an_error_after_some_events_is_raised_by_the_next_call(driver):
    t = driver.create_topic("sel", 1, type="memory")
    with t.producer() as p:
        p.push_many([({"i": i}, bytes(16)) for i in range(6)])

    def selector(meta, info):
        if meta["i"] == 3:
            raise KeyError("no such field")
        return True  # the whole data

    c = t.consumer("c", data_selector=selector)
    got = c.pull_many(6, timeout=30)
    # the events delivered ahead of the failure (the client fetches in
    # groups, so those of the failing group may not be among them)
    assert [e.metadata["i"] for e in got] in ([0], [0, 1], [0, 1, 2])
    with pytest.raises(strom.DataError) as err:
        c.pull_many(6, timeout=30)
    assert isinstance(err.value.__cause__, KeyError)
