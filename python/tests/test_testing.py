"""`strom.testing.find_binary`: which `strom` binary the helpers start."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import strom.testing


def fake_binary(path: Path, mtime: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    os.utime(path, (mtime, mtime))
    return path


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A fake repository: `find_binary` searches from `repo/python/strom`."""
    monkeypatch.delenv("STROM_BIN", raising=False)
    (tmp_path / "python" / "strom").mkdir(parents=True)
    return tmp_path


def test_find_binary_picks_the_release_build_when_it_is_newer(repo):
    fake_binary(repo / "target" / "debug" / "strom", 1_000_000)
    release = fake_binary(repo / "target" / "release" / "strom", 2_000_000)
    assert strom.testing.find_binary(repo / "python" / "strom") == str(release)


def test_find_binary_picks_the_debug_build_when_it_is_newer(repo):
    debug = fake_binary(repo / "target" / "debug" / "strom", 2_000_000)
    fake_binary(repo / "target" / "release" / "strom", 1_000_000)
    assert strom.testing.find_binary(repo / "python" / "strom") == str(debug)


def test_find_binary_takes_whichever_build_exists(repo):
    release = fake_binary(repo / "target" / "release" / "strom", 1_000_000)
    assert strom.testing.find_binary(repo / "python" / "strom") == str(release)


def test_find_binary_skips_files_that_are_not_executable(repo):
    debug = fake_binary(repo / "target" / "debug" / "strom", 1_000_000)
    fake_binary(repo / "target" / "release" / "strom", 2_000_000).chmod(0o644)
    assert strom.testing.find_binary(repo / "python" / "strom") == str(debug)


def test_strom_bin_overrides_the_search(repo, monkeypatch):
    fake_binary(repo / "target" / "release" / "strom", 2_000_000)
    monkeypatch.setenv("STROM_BIN", "/opt/strom/bin/strom")
    assert strom.testing.find_binary(repo / "python" / "strom") == "/opt/strom/bin/strom"


def test_find_binary_says_how_to_build_it_when_there_is_none(repo, monkeypatch):
    monkeypatch.setenv("PATH", str(repo / "empty"))
    with pytest.raises(FileNotFoundError, match="cargo build -p strom-cli"):
        strom.testing.find_binary(repo / "python" / "strom")
