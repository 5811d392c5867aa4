"""Shared fixtures: every test gets its own directory and server (embedded,
or a real `strom server` process on a free port)."""

from __future__ import annotations

import pytest

import strom
import strom.testing


@pytest.fixture(params=["memory", "file"])
def ptype(request) -> str:
    """Each conformance test runs once per partition type."""
    return request.param


@pytest.fixture
def driver(tmp_path):
    """A driver with its own embedded server in `tmp_path`."""
    d = strom.Driver.embedded(tmp_path / "data")
    yield d
    del d


@pytest.fixture
def server(tmp_path):
    """A real `strom server` process; yields the `strom.testing.Server`."""
    s = strom.testing.Server(tmp_path / "server")
    yield s
    s.stop()


def drain(consumer, timeout: float = 30.0) -> list:
    """Every event up to the end of the stream."""
    out = []
    while (ev := consumer.pull(timeout=timeout)) is not None:
        out.append(ev)
    return out


def take(consumer, n: int, timeout: float = 30.0) -> list:
    """The next `n` events."""
    out = []
    for _ in range(n):
        ev = consumer.pull(timeout=timeout)
        assert ev is not None, f"end of stream after {len(out)} of {n} events"
        out.append(ev)
    return out
