"""Request timeouts from Python: a server that stops answering (SIGSTOP,
its connections stay open) makes registry requests and pushes fail after
the timeout the program chose, instead of waiting for ever; the same driver
and producer work again once the server answers."""

from __future__ import annotations

import signal
import threading
import time

import pytest

import strom

# Longest a call may take before the test counts it as a hang.
HANG = 30.0


def timed(call):
    """Runs `call` in a thread; returns (its result or exception, seconds).
    Fails the test if it is still running after HANG seconds."""
    out = {}

    def run():
        try:
            out["value"] = call()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["value"] = e

    started = time.monotonic()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(HANG)
    took = time.monotonic() - started
    assert not t.is_alive(), f"still waiting after {HANG} s: no request timeout"
    return out["value"], took


def assert_timed_out(outcome, took, error, code):
    """`outcome` is the request timeout's `error`, raised after the 1 s
    timeout and well before a hang."""
    assert isinstance(outcome, error), repr(outcome)
    assert outcome.code == code
    assert "request timeout" in str(outcome)
    assert 1.0 <= took < 20.0, took


def test_a_registry_request_to_a_stopped_server_raises_timeout(server):
    d = strom.Driver.connect(server.group_file)
    d.set_request_timeout(1.0)
    d.create_topic("t", partitions=1)
    server.process.send_signal(signal.SIGSTOP)
    try:
        outcome, took = timed(lambda: d.describe("t"))
    finally:
        server.process.send_signal(signal.SIGCONT)
    assert_timed_out(outcome, took, strom.TimeoutError, 502)
    assert len(d.describe("t")["partitions"]) == 1, "the server answers again"


def test_a_push_to_a_stopped_server_fails_after_the_producer_request_timeout(server):
    d = strom.Driver.connect(server.group_file)
    p = d.create_topic("t", partitions=1).producer(request_timeout=1.0)
    p.push({"i": 0}, bytes(16)).result(timeout=HANG)
    server.process.send_signal(signal.SIGSTOP)
    try:
        pushed = p.push({"i": 1}, bytes(16))
        outcome, took = timed(lambda: pushed.result(timeout=60))
    finally:
        server.process.send_signal(signal.SIGCONT)
    assert_timed_out(outcome, took, strom.ConnectionError, 501)
    # flush reports the first error since the last flush, once.
    with pytest.raises(strom.ConnectionError, match="request timeout"):
        p.flush()
    assert p.push({"i": 2}, bytes(16)).result(timeout=HANG).partition == 0
    p.close()


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_a_request_timeout_must_be_a_positive_number_of_seconds(driver, bad):
    with pytest.raises(strom.InvalidArgument, match="request"):
        driver.set_request_timeout(bad)
    t = driver.create_topic("t", partitions=1, exist_ok=True)
    with pytest.raises(strom.InvalidArgument, match="request_timeout"):
        t.producer(request_timeout=bad)
