"""Memory topics: the overflow policy from Python (`create_topic(overflow=)`),
the explicit `DataExpired` gap a lagging reader gets under `drop-oldest`,
and what `describe` reports per partition."""

from __future__ import annotations

import pytest

import strom


def test_drop_oldest_gives_a_lagging_reader_an_explicit_gap(driver):
    t = driver.create_topic(
        "monitor", type="memory", overflow="drop-oldest", retention_bytes=8192
    )
    p = t.producer()
    for f in [p.push({"i": i}, bytes(1024)) for i in range(40)]:
        f.result()
    p.close()
    info = driver.describe("monitor")
    assert info["overflow"] == "drop-oldest"
    part = info["partitions"][0]
    assert part["status"] == "ok" and part["reason"] == ""
    assert part["dropped_events"] > 0
    first = part["first_offset"]
    # A reader that asks for offset 0, long dropped (a new name starting
    # from its committed position would begin at the oldest kept event).
    c = t.consumer("late", start=0)
    with pytest.raises(strom.DataExpired) as gap:
        c.pull(timeout=10)
    assert gap.value.code == 310
    assert f"0..={first - 1}" in str(gap.value)
    # Then the reader carries on with every event that was kept.
    offsets = []
    while (ev := c.pull(timeout=10)) is not None:
        offsets.append(ev.offset)
    assert offsets == list(range(first, 40))


def test_overflow_is_refused_on_file_topics(driver):
    with pytest.raises(strom.StromError) as e:
        driver.create_topic("f", overflow="block")
    assert "memory" in str(e.value)


def test_memory_topics_block_by_default(driver):
    t = driver.create_topic("mpi", type="memory")
    assert driver.describe("mpi")["overflow"] == "block"
    assert t is not None
