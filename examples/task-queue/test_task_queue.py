"""The task queue at small size on one real `strom server`: every task of
every generation gets a result, even when a worker is killed with SIGKILL
mid-run (its unacked tasks go to the others), and `run` works end to end."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import strom
import strom.testing

HERE = Path(__file__).resolve().parent
SCRIPT = str(HERE / "taskqueue.py")


def summary(out: str) -> dict:
    """The dispatcher's summary line (workers print their own counts)."""
    lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    return [l for l in lines if "tasks_per_s" in l][-1]


def test_a_killed_worker_loses_no_task(tmp_path):
    server = strom.testing.Server(tmp_path / "server")
    try:
        gf = ["--group-file", str(server.group_file)]
        workers = [
            subprocess.Popen([sys.executable, SCRIPT, "worker", *gf, "--name", f"w{k}",
                              "--work-ms", "2", "--prefetch", "8"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for k in range(3)
        ]
        disp = subprocess.Popen([sys.executable, SCRIPT, "dispatcher", *gf, "--generations", "4",
                                 "--population", "150", "--work-ms", "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = disp.stdout.readline()
        assert json.loads(first)["gen"] == 0, first
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait()
        out, err = disp.communicate(timeout=180)
        assert disp.returncode == 0, err
        s = summary(first + out)
        assert s["tasks"] == 600, s
        gens = [json.loads(l) for l in (first + out).splitlines() if '"gen"' in l]
        assert [g["results"] for g in gens] == [150] * 4, gens
        assert gens[-1]["best"] <= gens[0]["best"], "steering never makes the best worse"
        for w in workers[1:]:
            w.wait(timeout=120)
            assert w.returncode == 0, w.stderr.read()
        g = strom.Driver.connect(server.group_file).describe_group("workers")
        assert g["lag"] == 0 and g["pending"] == 0, g
    finally:
        server.stop()


def test_run_starts_everything_and_prints_a_summary(tmp_path):
    r = subprocess.run([sys.executable, SCRIPT, "run", "--workers", "2", "--generations", "2",
                        "--population", "50", "--dir", str(tmp_path / "q")],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    s = summary(r.stdout)
    assert s["tasks"] == 100 and s["tasks_per_s"] > 0, s
