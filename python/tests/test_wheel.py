"""A user outside the repository installs the wheel that `make wheel`
builds (into `target/wheels`) with pip, and uses it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

USER_PROGRAM = textwrap.dedent(
    """
    from pathlib import Path
    import strom

    package = Path(strom.__file__).parent
    assert "site-packages" in package.parts, f"strom imported from {package}, not the venv"
    assert (package / "py.typed").exists() and (package / "_strom.pyi").exists(), "type stubs"

    driver = strom.Driver.embedded("data")
    topic = driver.create_topic("greetings", 2)
    with topic.producer() as p:
        for i in range(3):
            p.push({"i": i}, f"hello {i}".encode())
    got = sorted((ev.metadata["i"], bytes(ev.data).decode()) for ev in topic.consumer("reader"))
    print(strom.__version__, got)
    """
)


def built_wheel() -> Path:
    """The newest wheel in `$STROM_WHEEL_DIR` (set by `make python-test`,
    which builds it first), else in `target/wheels`."""
    given = os.environ.get("STROM_WHEEL_DIR")
    wheels = sorted(Path(given or REPO / "target" / "wheels").glob("strom-*.whl"),
                    key=lambda w: w.stat().st_mtime)
    if not wheels:
        if given:
            pytest.fail(f"no strom wheel in STROM_WHEEL_DIR={given}")
        pytest.skip("no wheel in target/wheels: build it with `make wheel` (make python-test does)")
    return wheels[-1]


def test_the_wheel_installs_with_pip_and_round_trips_outside_the_repository(tmp_path):
    wheel = built_wheel()
    venv, home = tmp_path / "venv", tmp_path / "user"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "STROM_", "VIRTUAL_ENV", "CARGO"))}

    def run(*cmd: str) -> str:
        r = subprocess.run(cmd, cwd=home, env=env, capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}"
        return r.stdout

    run(sys.executable, "-m", "venv", str(venv))
    py = str(venv / "bin" / "python")
    run(py, "-m", "pip", "install", "--quiet", "--no-index", "--disable-pip-version-check", str(wheel))
    out = run(py, "-c", USER_PROGRAM)
    assert out.split(" ", 1)[1].strip() == "[(0, 'hello 0'), (1, 'hello 1'), (2, 'hello 2')]", out
