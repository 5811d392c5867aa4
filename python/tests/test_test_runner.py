"""scripts/test-runner, the runner make test gives every Rust test binary:
it passes a binary's exit status through, and a binary still running after
STROM_TEST_LIMIT seconds is reported as hung and killed with everything it
started."""

import os
import subprocess
import sys
import time
from pathlib import Path

RUNNER = Path(__file__).resolve().parents[2] / "scripts" / "test-runner"


def run(args, limit, timeout=60):
    env = dict(os.environ, STROM_TEST_LIMIT=str(limit))
    return subprocess.run(
        [str(RUNNER), *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def test_a_binary_that_ends_keeps_its_exit_status():
    assert run([sys.executable, "-c", "import sys; sys.exit(3)"], 60).returncode == 3
    ok = run([sys.executable, "-c", "print('fine')"], 60)
    assert ok.returncode == 0
    assert ok.stdout == "fine\n"


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_hung_binary_is_reported_and_killed_with_what_it_started(tmp_path):
    pid_file = tmp_path / "grandchild"
    # A "test binary" that starts a process of its own and then hangs.
    hang = (
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(c.pid))\n"
        "time.sleep(600)\n"
    )
    started = time.monotonic()
    out = run([sys.executable, "-c", hang], 2)
    assert out.returncode == 124, out.stderr
    assert time.monotonic() - started < 45
    assert "still running after 2 s: hung" in out.stderr
    assert "*** stacks of pid" in out.stderr
    assert "killed" in out.stderr
    grandchild = int(pid_file.read_text())
    assert "time.sleep(600)" in out.stderr, "the processes it started are named"
    deadline = time.monotonic() + 5
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(grandchild), "a process the hung binary started was left running"
