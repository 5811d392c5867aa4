"""strom.transform: a user-defined transform with the built-in ones'
guarantees. A run that fails midway (its function raises) and is run
again writes every output exactly once, in source order."""

from __future__ import annotations

import numpy as np
import pytest

import strom


def fill(driver, n: int = 60):
    src = driver.create_topic("raw", partitions=2)
    with src.producer() as p:
        for i in range(n):
            p.push({"i": i}, np.full((4, 4), i, dtype=np.float32), partition=i % 2)
    return src


def test_a_transform_writes_each_output_once_across_a_failed_run(driver):
    src = fill(driver)
    dst = driver.create_topic("means", partitions=2)
    fail = [True]

    def mean_of_even(ev):
        i = ev.metadata["i"]
        if i == 41 and fail[0]:
            fail[0] = False
            raise RuntimeError("boom")
        if i % 2 == 1:
            return [({"i": i, "half": 1}, b"a"), ({"i": i, "half": 2}, b"b")]
        arr = np.asarray(ev.data, dtype=np.float32)
        return {"i": i, "mean": float(arr.mean())}, np.array([arr.mean()], dtype=np.float64)

    with pytest.raises(strom.StromError) as e:
        strom.transform(mean_of_even, src, dst, name="means")
    assert isinstance(e.value.__cause__, RuntimeError)
    read, written = strom.transform(mean_of_even, src, dst, name="means")
    assert read <= 60
    c = dst.consumer("check")
    got = {0: [], 1: []}
    for _ in range(90):
        ev = c.pull(timeout=10)
        assert ev is not None
        got[ev.partition].append((ev.metadata, bytes(ev.data)))
    with pytest.raises(strom.TimeoutError):
        c.pull(timeout=0.5)  # nothing more: no output was written twice
    for p in (0, 1):
        want = []
        for i in range(p, 60, 2):
            if i % 2 == 1:
                want += [({"i": i, "half": 1}, b"a"), ({"i": i, "half": 2}, b"b")]
            else:
                want.append(({"i": i, "mean": float(i)}, np.array([i], np.float64).tobytes()))
        assert got[p] == want, f"partition {p}"


def test_returning_something_else_is_a_type_error(driver):
    src = fill(driver, 4)
    dst = driver.create_topic("out", partitions=1)
    with pytest.raises(strom.StromError) as e:
        strom.transform(lambda ev: 42, src, dst, name="bad")
    assert isinstance(e.value.__cause__, TypeError)
