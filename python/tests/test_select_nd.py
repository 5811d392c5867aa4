"""N-d array selections: `strom.select.array[...]` fetches exactly the bytes
of a sub-array, which the consumer receives as a numpy array equal, byte for
byte, to numpy's own slicing of the original."""

from __future__ import annotations

import numpy as np
import pytest

import strom
from conftest import drain

S = slice
INDEXES = [
    (S(None), S(1, 4), S(None, None, 2)),
    (S(None), S(1, 4)),
    (1,),
    (1, 2, 3),
    (Ellipsis, 2),
    (Ellipsis, S(2, 5)),
    (S(None, None, -1), S(None), S(None, None, -2)),
    (S(-2, None), S(None, -1), S(1, None, 3)),
    (S(0, 0),),
    (S(None), 0, S(None)),
    (S(3, 1, -1), Ellipsis, S(5, 0, -2)),
    (),
]


def region_bytes(a: np.ndarray, index) -> tuple[bytes, tuple]:
    # A trailing ... keeps a 0-d result an array (numpy scalars lose byte order).
    r = a[index] if Ellipsis in index else a[tuple(index) + (Ellipsis,)]
    fixed = np.asfortranarray(r) if a.flags.f_contiguous and not a.flags.c_contiguous else np.ascontiguousarray(r)
    return fixed.tobytes(order="A"), r.shape


@pytest.mark.parametrize("order", ["C", "F"])
def test_sub_arrays_of_3d_arrays_match_numpy_byte_for_byte(driver, ptype, order):
    rng = np.random.default_rng(7)
    arrays = [
        np.asarray(rng.standard_normal((4, 6, 7)).astype("<f4"), order=order),
        np.asarray(rng.integers(0, 1 << 40, (5, 3, 8)).astype(">i8"), order=order),
        np.asarray(rng.integers(0, 255, (2, 9, 6)).astype("|u1"), order=order),
    ]
    t = driver.create_topic("nd", 1, type=ptype)
    with t.producer() as p:
        for i, a in enumerate(arrays):
            p.push({"i": i}, a)
    for n, index in enumerate(INDEXES):
        sel = strom.select.array[index] if index != () else strom.select.array[...]
        events = drain(t.consumer(f"c{n}", data_selector=sel))
        assert len(events) == len(arrays)
        for ev in events:
            a = arrays[ev.metadata["i"]]
            want, shape = region_bytes(a, index)
            got = ev.data
            assert isinstance(got, np.ndarray), f"{index}"
            assert got.shape == shape, f"{index}: shape"
            assert got.dtype == a.dtype
            assert got.tobytes(order="A") == want, f"{index} on {a.dtype} {order}"
            assert np.array_equal(got, a[index])
            assert got.flags.writeable
            assert ev.fetched_size == len(want), "only the region's bytes were fetched"
            assert ev.data_size == a.nbytes


def test_python_selector_may_return_array_selections(driver):
    a = np.arange(5 * 6 * 7, dtype="<i4").reshape(5, 6, 7)
    t = driver.create_topic("ndpy", 1, type="memory")
    with t.producer() as p:
        for k in range(3):
            p.push({"k": k}, a + k)

    def pick(meta, info):
        assert info["dtype"] == "<i4" and info["shape"] == (5, 6, 7) and info["order"] == "C"
        return strom.select.array[meta["k"], :, 2:4]

    events = drain(t.consumer("py", data_selector=pick))
    for ev in events:
        k = ev.metadata["k"]
        assert np.array_equal(ev.data, (a + k)[k, :, 2:4])


def test_where_then_array_selects_regions_of_matching_events_only(driver):
    a = np.arange(60, dtype="<f8").reshape(3, 4, 5)
    t = driver.create_topic("ndwhere", 1, type="memory")
    with t.producer() as p:
        for k in range(4):
            p.push({"keep": k % 2 == 0}, a * k)
    sel = strom.select.where("keep", "==", True, strom.select.array[:, 1, ::2])
    events = drain(t.consumer("w", data_selector=sel))
    for k, ev in enumerate(events):
        if k % 2 == 0:
            assert np.array_equal(ev.data, (a * k)[:, 1, ::2])
        else:
            assert ev.fetched_size == 0


def test_array_selection_on_non_array_data_is_a_data_error(driver):
    t = driver.create_topic("ndbad", 1, type="memory")
    with t.producer() as p:
        p.push({}, b"not an array")
    c = t.consumer("c", data_selector=strom.select.array[1:])
    with pytest.raises(strom.DataError) as err:
        c.pull(timeout=30)
    assert err.value.code == 601
    assert "array descriptor" in str(err.value.__cause__)


def test_bad_indexes_are_refused(driver):
    a = np.zeros((2, 3), dtype="<f4")
    t = driver.create_topic("ndidx", 1, type="memory")
    with t.producer() as p:
        p.push({}, a)
    with pytest.raises(strom.DataError):
        t.consumer("c1", data_selector=strom.select.array[5]).pull(timeout=30)
    with pytest.raises(strom.DataError):
        t.consumer("c2", data_selector=strom.select.array[0, 0, 0]).pull(timeout=30)
    with pytest.raises(TypeError):
        strom.select.array["x"]
