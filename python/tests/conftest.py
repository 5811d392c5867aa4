"""Shared fixtures: every test gets its own directory and server (embedded,
or a real `strom server` process on a free port)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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


def run_bench_smoke(script, *args: str):
    """Runs a bench script (`--smoke --json` and `args`) with this tree's
    `strom` binary; asserts it exited 0 and returns (stdout, the JSON
    object on its last line)."""
    r = subprocess.run(
        [sys.executable, str(script), "--smoke", "--json", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "STROM_BIN": strom.testing.find_binary(script)},
    )
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r.stdout, json.loads(r.stdout.strip().splitlines()[-1])
