"""The wheel speaks libfabric: an embedded server listening on ofi+tcp and
ofi+shm, numpy arrays pushed (lent, and read by the server with RMA) and
pulled back over it, and a lent buffer given back once its batch is
stored, as over TCP."""

from __future__ import annotations

import numpy as np
import pytest

import strom
from conftest import drain


@pytest.fixture(params=["ofi+tcp", "ofi+shm"])
def ofi_driver(request, tmp_path):
    # ofi+tcp://auto binds the provider's network address: no auth here.
    d = strom.Driver.embedded(str(tmp_path / "data"), listen=f"{request.param}://auto", insecure=True)
    assert d.address.startswith(f"{request.param}://"), d.address
    yield d
    del d


def test_arrays_round_trip_over_ofi(ofi_driver):
    t = ofi_driver.create_topic("arrays", 2)
    # Small ones go inline; 64 KiB and up are read by the server with RMA.
    sent = [np.arange(n, dtype="<f8") * (i + 1) for i, n in enumerate([16, 2048, 8192, 131072, 524288])]
    with t.producer() as p:
        for i, a in enumerate(sent):
            p.push({"i": i}, a, partition=i % 2)
    got = {ev.metadata["i"]: ev.data for ev in drain(t.consumer("c"))}
    assert sorted(got) == list(range(len(sent)))
    for i, a in enumerate(sent):
        assert got[i].dtype == a.dtype and np.array_equal(got[i], a), i


def test_a_lent_buffer_is_given_back_over_ofi(ofi_driver):
    t = ofi_driver.create_topic("lend", 1)
    data = bytearray(b"y" * (1 << 20))  # past the inline size: RMA
    p = t.producer()
    p.push({}, data).wait()
    p.push({}, None)  # any call holding the GIL releases finished loans
    data.extend(b"more")  # an exported bytearray cannot be resized: given back
    p.close()
    (first, _) = drain(t.consumer("c"))
    assert bytes(first.data) == b"y" * (1 << 20)
