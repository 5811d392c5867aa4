"""The benchmark runs as a small smoke test so it cannot rot (no timing asserts)."""

from __future__ import annotations

import subprocess
import sys


def test_bench_smoke_run_prints_every_measurement():
    r = subprocess.run(
        [sys.executable, "-m", "strom.bench", "--smoke"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    for needle in ("push overhead", "median", "p99", "consume", "events/s", "rust"):
        assert needle in r.stdout, f"missing '{needle}' in:\n{r.stdout}"
