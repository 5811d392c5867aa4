"""bench/python/pipeline.py (suite scenario 7) runs as a tiny smoke test so it
cannot rot: every system delivers every event, checked; no timing asserts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from conftest import run_bench_smoke

PIPELINE = Path(__file__).resolve().parents[2] / "bench" / "python" / "pipeline.py"


def test_pipeline_smoke_every_system_delivers_every_event():
    systems = ["strom-tcp", "strom-shm"]
    if importlib.util.find_spec("zmq") is not None:
        systems = ["zmq-ipc", "zmq-tcp", *systems]
    stdout, out = run_bench_smoke(PIPELINE, "--systems", ",".join(systems), "--api", "event,many")
    assert out["failed_runs"] == 0, out
    # each Strom system also runs with push_many / pull_many, as "<system>+many"
    systems = [v for s in systems for v in ((s, s + "+many") if s.startswith("strom") else (s,))]
    assert out["systems"] == systems
    assert len(out["runs"]) == len(systems) * len(out["sizes"]) == len(systems) * 2
    for run in out["runs"]:
        assert not run.get("failed"), run
        assert run["events"] == 200
        assert run["received"] == run["events"] + run["warmup"], run
        assert run["events_per_s"] > 0 and run["mb_per_s"] > 0
        # page faults per GB of each process (the server's only for Strom)
        faults = run["faults_per_gb"]
        assert set(faults) == ({"producer", "consumer", "server"} if run["system"].startswith(
            "strom") else {"producer", "consumer"}), run
        assert all(f >= 0 for f in faults.values()), run
    shm = [run for run in out["runs"] if run["system"].startswith("strom-shm")]
    assert all(run["shm_connections"] >= 2 for run in shm), shm
    tcp = [run for run in out["runs"] if run["system"].startswith("strom-tcp")]
    assert all(run["shm_connections"] == 0 for run in tcp), tcp
    assert all(run["many"] >= 1 for run in out["runs"] if run["system"].endswith("+many"))
    for needle in ("events/s", "MB/s", "faults/GB", "strom-shm", "strom-tcp", "strom-shm+many"):
        assert needle in stdout
