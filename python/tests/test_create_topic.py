"""`create_topic(exist_ok=True)` for programs that run more than once, and
the README's quick start, run twice in a row as a user would."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import strom

README = Path(__file__).resolve().parents[1] / "README.md"


def test_exist_ok_returns_the_existing_topic_with_its_events(driver):
    first = driver.create_topic("frames", 2)
    with first.producer() as p:
        p.push({"i": 1}, b"x")
        p.push({"i": 2}, b"y")
    again = driver.create_topic("frames", 2, exist_ok=True)
    assert (again.name, again.partitions) == ("frames", 2)
    assert sorted(e.metadata["i"] for e in again.consumer("check")) == [1, 2]
    assert [t["name"] for t in driver.list_topics()] == ["frames"]


def test_exist_ok_creates_the_topic_when_it_is_missing(driver):
    t = driver.create_topic("fresh", 3, type="memory", exist_ok=True)
    assert t.partitions == 3 and driver.describe("fresh")["type"] == "memory"


def test_without_exist_ok_an_existing_topic_still_raises(driver):
    driver.create_topic("frames", 2)
    with pytest.raises(strom.TopicExists) as err:
        driver.create_topic("frames", 2)
    assert err.value.code == 201


@pytest.mark.parametrize(
    "asked, differs",
    [({"partitions": 4}, "4 of type 'file'"), ({"type": "memory"}, "2 of type 'memory'")],
)
def test_exist_ok_refuses_a_topic_with_other_partitions_or_type(driver, asked, differs):
    driver.create_topic("frames", 2)
    kwargs = {"partitions": 2, **asked}
    with pytest.raises(strom.TopicExists) as err:
        driver.create_topic("frames", exist_ok=True, **kwargs)
    message = str(err.value)
    assert "already exists with 2 partition(s) of type 'file'" in message, message
    assert f"asked for {differs}" in message, message
    assert err.value.code == 201
    assert driver.describe("frames")["type"] == "file", "the existing topic is left alone"


def quick_start() -> str:
    """The README's first ```python block."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, f"{README} has no ```python block"
    return blocks[0]


def test_readme_quick_start_runs_twice_in_a_row(tmp_path):
    code = quick_start()
    assert "open_topic" in code, "the quick start shows how to open an existing topic"
    outputs = []
    for run in (1, 2):
        r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, f"run {run} of the README quick start failed:\n{r.stderr}"
        outputs.append(sorted(r.stdout.splitlines()))
    # Both runs read the whole stored stream (partitions may interleave differently).
    assert outputs[0] and outputs[0] == outputs[1], outputs
