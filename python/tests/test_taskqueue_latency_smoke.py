"""bench/python/taskqueue_latency.py runs as a tiny smoke test so it cannot
rot: both Strom modes carry every task and its result, one in flight, each
result naming the task just sent; no timing asserts. (The Redis systems
need redis-py, which only the benchmark's own install step provides.)"""

from __future__ import annotations

from pathlib import Path

from conftest import run_bench_smoke

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "python" / "taskqueue_latency.py"


def test_taskqueue_latency_smoke_carries_every_task_in_both_strom_modes():
    stdout, out = run_bench_smoke(SCRIPT, "--systems", "strom-shared,strom-plain")
    assert out["failed_runs"] == 0, out
    assert out["systems"] == ["strom-shared", "strom-plain"]
    assert len(out["runs"]) == 2
    for run in out["runs"]:
        assert not run.get("failed"), run
        assert run["tasks"] == 50 and run["warmup"] == 5
        assert 0 < run["p50_us"] <= run["p99_us"], run
    assert set(out["table"]) == {"strom-shared", "strom-plain"}
    assert "p50" in stdout and "strom-shared" in stdout
