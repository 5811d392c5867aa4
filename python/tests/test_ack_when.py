"""Event.ack_when: a worker acks each task once its result is stored, in the
natural loop, without polling. Before it, a worker holding `prefetch`
unacked tasks received nothing more, so this loop stalled for the
visibility timeout and tasks came back."""

from __future__ import annotations

from pathlib import Path

import pytest
import strom


def test_the_natural_worker_loop_acks_when_results_are_stored(tmp_path: Path) -> None:
    d = strom.Driver.embedded(tmp_path / "data")
    tasks = d.create_topic("tasks", 1)
    results = d.create_topic("results", 1)
    p = tasks.producer(lease=None)
    p.push_many([b""] * 1000, metadata={"task": True})
    p.close()
    worker = tasks.consumer(group="g", mode="shared", prefetch=16, visibility_timeout=10.0)
    out = results.producer()
    done = 0
    for ev in worker:  # ends once every task is acked
        assert ev.deliveries == 1, f"task {ev.offset} came back: its ack never went"
        ev.ack_when(out.push({"task": ev.offset}))
        done += 1
    assert done == 1000
    out.close()
    g = d.describe_group("g")
    assert (g["partitions"][0]["pending"], g["partitions"][0]["redelivered"]) == (0, 0), g


def test_ack_when_takes_push_futures_and_refuses_anything_else(tmp_path: Path) -> None:
    d = strom.Driver.embedded(tmp_path / "data")
    tasks = d.create_topic("tasks", 1)
    results = d.create_topic("results", 1)
    p = tasks.producer(lease=None)
    p.push({"i": 0})
    p.close()
    worker = tasks.consumer(group="g", mode="shared")
    ev = worker.pull(timeout=20.0)
    assert ev is not None
    with pytest.raises(TypeError, match="PushFuture or PushFutures, not int"):
        ev.ack_when(3)
    out = results.producer()
    ev.ack_when(out.push({"r": 1}), out.push_many([b"a", b"b"], metadata={"r": 2}))
    out.close()
    # The end of the stream comes once the task is acked, after its three results.
    assert worker.pull(timeout=20.0) is None
