"""Helpers for tests and examples: run a real ``strom server`` process in a
directory of your choice, on a free port, and stop it afterwards.

Example::

    with strom.testing.Server(tmp_path) as server:
        driver = strom.Driver.connect(server.group_file)
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

__all__ = ["Server", "find_binary"]


def find_binary(search_from: str | os.PathLike | None = None) -> str:
    """The ``strom`` binary: ``$STROM_BIN``; else the newer (by modification
    time) of ``target/debug/strom`` and ``target/release/strom`` in
    ``search_from`` (default: this package's file) or the nearest directory
    above it that has either; else ``strom`` on ``PATH``."""
    env = os.environ.get("STROM_BIN")
    if env:
        return env
    start = Path(search_from) if search_from is not None else Path(__file__)
    start = start.resolve()
    for parent in (start, *start.parents):
        builds = [parent / "target" / kind / "strom" for kind in ("debug", "release")]
        builds = [b for b in builds if b.is_file() and os.access(b, os.X_OK)]
        if builds:
            return str(max(builds, key=lambda b: b.stat().st_mtime))
    found = shutil.which("strom")
    if found:
        return found
    raise FileNotFoundError(
        "cannot find the strom binary: build it (cargo build -p strom-cli) or set STROM_BIN"
    )


class Server:
    """A ``strom server`` process with its data and group file under ``directory``."""

    def __init__(self, directory: str | os.PathLike, binary: str | None = None, start: bool = True):
        self.directory = Path(directory)
        self.binary = binary or find_binary()
        self.data_dir = self.directory / "server-data"
        self.group_file = self.directory / "group.json"
        self.log = self.directory / "server.log"
        self.process: subprocess.Popen | None = None
        if start:
            self.start()

    def start(self, timeout: float = 30.0) -> None:
        """Starts the server (again, on a new port) and waits for its group file."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.group_file.exists():
            self.group_file.unlink()
        log = open(self.log, "ab")
        self.process = subprocess.Popen(
            [
                self.binary,
                "--group-file",
                str(self.group_file),
                "server",
                "--data-dir",
                str(self.data_dir),
                "--listen",
                "127.0.0.1:0",
            ],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not self.group_file.exists():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"strom server exited with {self.process.returncode}: {self.log.read_text()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"strom server did not start within {timeout}s")
            time.sleep(0.02)

    def stop(self, timeout: float = 10.0) -> None:
        """Stops the server cleanly (SIGTERM), or kills it after ``timeout``."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None

    def kill(self) -> None:
        """Kills the server (SIGKILL)."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
