"""fork(): Strom's threads do not survive it. Objects made before the fork
raise a clear ForkError in the child; a driver made in the child works."""

from __future__ import annotations

import multiprocessing

import strom
from conftest import drain


def use_parent_driver(driver, topic, queue):
    out = []
    for action in (lambda: driver.list_topics(), lambda: topic.producer(), lambda: topic.consumer("x")):
        try:
            action()
            out.append("worked")
        except strom.ForkError as e:
            out.append((e.code, "after forking" in str(e)))
    queue.put(out)


def use_own_driver(address, queue):
    d = strom.Driver.connect(address=address)
    with d.open_topic("forked").producer() as p:
        ids = [p.push({"from": "child", "i": i}).wait().offset for i in range(5)]
    queue.put(ids)


def test_objects_from_before_a_fork_raise_a_clear_error_in_the_child(driver):
    t = driver.create_topic("forked", 1, type="memory")
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    child = ctx.Process(target=use_parent_driver, args=(driver, t, q))
    child.start()
    result = q.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0
    assert result == [(503, True)] * 3
    # The parent's objects still work.
    assert [x["name"] for x in driver.list_topics()] == ["forked"]


def test_a_driver_created_after_the_fork_works_in_the_child(driver):
    t = driver.create_topic("forked", 1, type="memory")
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    child = ctx.Process(target=use_own_driver, args=(driver.address, q))
    child.start()
    assert q.get(timeout=60) == list(range(5))
    child.join(60)
    assert child.exitcode == 0
    events = drain(t.consumer("c"))
    assert [e.metadata["i"] for e in events] == list(range(5))
