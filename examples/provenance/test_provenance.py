"""The provenance example at a tiny size (make test): a sweep of 121 Dask
tasks with capture off and with Strom, on a `strom server` it starts; each
Strom run's topic must hold one record per task (sweep.py checks it), and
the summary names both modes. Timings are printed, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_the_sweep_runs_with_and_without_capture_and_every_task_is_recorded():
    out = subprocess.run(
        [sys.executable, str(HERE / "sweep.py"), "--params", "60", "--rounds", "2"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    lines = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    runs = [l for l in lines if "mode" in l]
    assert [(l["round"], l["mode"]) for l in runs] == [
        (0, "off"), (0, "strom"), (1, "off"), (1, "strom"),
    ]
    summary = lines[-1]
    assert summary["tasks"] == 121
    assert set(summary["median_s"]) == {"off", "strom"}
    assert "strom" in summary["overhead_pct"]
    print(out.stdout)
