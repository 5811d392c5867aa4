"""numpy arrays in and out without copies: the producer lends the array's
memory to Strom, and the consumer's array is a view over the received
buffer, with dtype, shape and order from the event's descriptor."""

from __future__ import annotations

import json

import numpy as np
import pytest

import strom
from conftest import drain


def buffer_of(a: np.ndarray):
    """The strom.Buffer at the bottom of an array's base chain."""
    base = a
    while base is not None and not isinstance(base, strom.Buffer):
        base = getattr(base, "base", None) if not isinstance(base, memoryview) else base.obj
    return base


@pytest.mark.parametrize(
    "array",
    [
        np.arange(24, dtype="<f4").reshape(2, 3, 4),
        np.asfortranarray(np.arange(60, dtype=">i8").reshape(3, 4, 5)),
        np.array(3.5, dtype="<f8"),
        np.zeros((0, 4), dtype="<u2"),
        (np.arange(10) + 1j * np.arange(10)).astype("<c16"),
        np.array([True, False, True]),
    ],
    ids=["f4-C", "i8-big-endian-F", "0-d", "empty", "c16", "bool"],
)
def test_array_round_trips_with_dtype_shape_and_order(driver, ptype, array):
    t = driver.create_topic("arr", 1, type=ptype)
    with t.producer() as p:
        p.push({"k": 1}, array)
    (ev,) = drain(t.consumer("c"))
    desc = json.loads(ev.descriptor)
    assert desc == {
        "dtype": array.dtype.str,
        "shape": list(array.shape),
        "order": "F" if array.ndim > 1 and array.flags.f_contiguous and not array.flags.c_contiguous else "C",
    }
    got = ev.data
    assert isinstance(got, np.ndarray)
    assert got.dtype == array.dtype and got.shape == array.shape
    assert np.array_equal(got, array)
    assert got.flags.f_contiguous == array.flags.f_contiguous
    assert got.tobytes(order="A") == array.tobytes(order="A")


def test_received_array_is_a_view_over_the_receive_buffer(driver):
    t = driver.create_topic("view", 1, type="memory")
    with t.producer() as p:
        p.push({}, np.arange(1000, dtype="<f8"))
    (ev,) = drain(t.consumer("c"))
    a = ev.data
    buf = buffer_of(a)
    assert isinstance(buf, strom.Buffer), "the array's memory is Strom's receive buffer"
    assert a.__array_interface__["data"][0] == buf.address, "no copy: same address"
    assert a.flags.writeable
    a[0] = 42.0  # writable in place
    assert ev.data[0] == 42.0 and ev.data is a, "cached, same object"


def test_bytes_data_is_a_zero_copy_memoryview(driver):
    t = driver.create_topic("mv", 1, type="memory")
    with t.producer() as p:
        p.push({}, b"abc" * 100)
    (ev,) = drain(t.consumer("c"))
    mv = ev.data
    assert isinstance(mv, memoryview) and isinstance(mv.obj, strom.Buffer)
    assert np.frombuffer(mv, "u1").__array_interface__["data"][0] == mv.obj.address
    assert bytes(mv) == b"abc" * 100


def test_a_descriptor_that_does_not_match_the_data_is_not_trusted(driver):
    # A producer's descriptor may claim more (or less) than its data: the
    # consumer gets the bytes as they are, never an array past their end.
    t = driver.create_topic("lie", 1, type="memory")
    with t.producer() as p:
        big = b'{"dtype": "<f8", "shape": [1000000], "order": "C"}'
        p.push({}, b"x" * 16, descriptor=big)
        small = b'{"dtype": "<f8", "shape": [1], "order": "C"}'
        p.push({}, b"y" * 16, descriptor=small)
        p.push({}, np.arange(2, dtype="<f8"))
    lying_big, lying_small, honest = drain(t.consumer("c"))
    for ev, want in ((lying_big, b"x" * 16), (lying_small, b"y" * 16)):
        assert isinstance(ev.data, memoryview) and bytes(ev.data) == want
    assert isinstance(honest.data, np.ndarray) and list(honest.data) == [0.0, 1.0]


def test_pushed_buffers_are_lent_not_copied_until_acknowledged(driver):
    t = driver.create_topic("lend", 1, type="memory")
    p = t.producer(batch=1000, linger=60)  # the batch waits: the buffer stays lent
    data = bytearray(b"x" * 4096)
    fut = p.push({}, data)
    with pytest.raises(BufferError):
        data.extend(b"more")  # an exported bytearray cannot be resized: Strom holds it
    p.flush()
    fut.wait()
    p.push({}, None)  # any call holding the GIL releases finished loans
    data.extend(b"more")  # released once the batch was acknowledged
    p.close()


def test_broker_writes_straight_into_application_arrays(driver, ptype):
    t = driver.create_topic("broker", 1, type=ptype)
    src = [np.full((16, 16), i, dtype="<f4") for i in range(3)]
    with t.producer() as p:
        for i, a in enumerate(src):
            p.push({"i": i}, a)
    dests = []

    def broker(meta, length):
        d = np.empty(length // 4, dtype="<f4")
        dests.append(d)
        return d

    events = drain(t.consumer("c", data_broker=broker))
    for ev, d in zip(events, dests):
        assert ev.data is d, "the data landed in the broker's own array"
        assert np.array_equal(d.reshape(16, 16), src[ev.metadata["i"]])


def test_non_contiguous_arrays_are_refused_with_advice(driver):
    t = driver.create_topic("nc", 1, type="memory")
    p = t.producer()
    with pytest.raises(ValueError, match="ascontiguousarray"):
        p.push({}, np.arange(100).reshape(10, 10)[:, ::2])
    with pytest.raises(TypeError):
        p.push({}, np.array([object()]))
    with pytest.raises(TypeError):
        p.push({}, 12345)
    p.close()


def test_metadata_accepts_numpy_scalars(driver):
    t = driver.create_topic("npmeta", 1, type="memory")
    with t.producer() as p:
        p.push({"i": np.int64(7), "f": np.float32(0.5), "b": np.bool_(True)})
    (ev,) = drain(t.consumer("c"))
    assert ev.metadata == {"i": 7, "f": 0.5, "b": True}


def test_data_and_metadata_are_built_once_even_when_threads_race_for_them(driver):
    """Event.data and Event.metadata are built on first access and cached:
    threads that ask at the same moment all get the same object."""
    import threading

    t = driver.create_topic("race", 1)
    with t.producer() as p:
        for i in range(64):
            p.push({"i": i}, np.full(256, i, dtype="<u4"))
    events = drain(t.consumer("c"))
    assert len(events) == 64
    start = threading.Barrier(8)
    seen = [[] for _ in range(8)]

    def read(k):
        start.wait()
        for ev in events:
            seen[k].append((ev.data, ev.metadata))

    threads = [threading.Thread(target=read, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for i, ev in enumerate(events):
        data, meta = seen[0][i]
        assert int(data[0]) == i and data.shape == (256,) and meta == {"i": i}
        for k in range(1, 8):
            assert seen[k][i][0] is data and seen[k][i][1] is meta
        assert ev.data is data
