"""The tomography pipeline at small size: every stage a separate process on
one real `strom server`. Stages can start in any order; a SIRT worker
killed mid-run restarts from its acked offset, and every slice reaches the
denoiser exactly once."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import strom
import strom.testing

HERE = Path(__file__).resolve().parent
PIPELINE = str(HERE / "pipeline.py")
K, SLICES, SCANS, SIZE, ANGLES = 2, 6, 3, 24, 18
SIZES = ["--workers", str(K), "--slices", str(SLICES), "--scans", str(SCANS),
         "--size", str(SIZE), "--angles", str(ANGLES), "--iterations", "40"]


@pytest.fixture
def server(tmp_path):
    s = strom.testing.Server(tmp_path / "server")
    yield s
    s.stop()


class Stages:
    def __init__(self, server, tmp_path):
        self.group = str(server.group_file)
        self.out = tmp_path / "den"
        self.logs = tmp_path / "logs"
        self.logs.mkdir()
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, *extra: str) -> subprocess.Popen:
        stage = name.split("-")[0]
        cmd = [sys.executable, PIPELINE, stage, "--group-file", self.group, "--out", str(self.out), *SIZES, *extra]
        log = open(self.logs / f"{name}.log", "a")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.procs[name] = p
        return p

    def wait(self, *names: str, timeout: float = 240) -> None:
        for n in names:
            rc = self.procs[n].wait(timeout)
            assert rc == 0, f"stage {n} exited with {rc}:\n{self.log(n)}"

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text()

    def finish(self) -> None:
        subprocess.run([sys.executable, PIPELINE, "finish", "--group-file", self.group, *SIZES], check=True, timeout=60)

    def kill_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def stages(server, tmp_path):
    s = Stages(server, tmp_path)
    yield s
    s.kill_all()


def check_results(out: Path) -> None:
    """Every (scan, slice) arrived exactly once and looks like the phantom."""
    received = [json.loads(line) for line in (out / "received.jsonl").read_text().splitlines()]
    keys = [(r["scan"], r["slice"]) for r in received]
    assert sorted(keys) == [(j, s) for j in range(SCANS) for s in range(SLICES)], (
        f"slices lost or repeated: {sorted(keys)}"
    )
    sys.path.insert(0, str(HERE))
    import pipeline

    for j in range(SCANS):
        for s in range(SLICES):
            img = np.load(out / f"scan{j}_slice{s}.npy")
            truth = pipeline.phantom(SIZE, s, j)
            corr = np.corrcoef(img.ravel(), truth.ravel())[0, 1]
            assert corr > 0.85, f"scan {j} slice {s}: reconstruction correlates only {corr:.2f}"


def test_stages_started_consumers_first_run_the_whole_pipeline(stages):
    # Reverse order: every consumer is waiting before any data exists.
    stages.start("den")
    for k in range(K):
        stages.start(f"sirt-{k}", "--worker", str(k))
    stages.start("dist")
    time.sleep(0.5)
    stages.start("daq")
    stages.wait("daq", "dist", *[f"sirt-{k}" for k in range(K)])
    stages.finish()
    stages.wait("den")
    check_results(stages.out)


def test_a_killed_sirt_worker_resumes_from_its_acked_offset(stages, server):
    # Producer first this time: the data waits in the file partitions.
    stages.start("daq")
    stages.wait("daq")
    stages.start("dist")
    stages.start("sirt-1", "--worker", "1")
    stages.start("den")
    stages.start("sirt-0", "--worker", "0", "--slow", "0.3")
    d = strom.Driver.connect(server.group_file)
    per_scan = len(range(0, SLICES, K))
    # Wait until worker 0 stored its first scan (and a bit of the next), then kill -9.
    deadline = time.monotonic() + 120
    while d.describe("slices")["partitions"][0]["next_offset"] < per_scan + 1:
        assert time.monotonic() < deadline, stages.log("sirt-0")
        time.sleep(0.05)
    stages.procs["sirt-0"].kill()
    stages.procs["sirt-0"].wait()
    committed = d.consumer_offsets("sinograms", 0).get("sirt-0", 0)
    assert committed > 0, "the worker acked its first scan before it was killed"
    stages.start("sirt-0b", "--worker", "0")
    stages.wait("dist", "sirt-1", "sirt-0b")
    log = stages.log("sirt-0b")
    assert f"resumed at offset {committed}" in log, log
    stages.finish()
    stages.wait("den")
    check_results(stages.out)


def test_run_uses_the_given_sizes_and_runs_again_into_the_same_out(tmp_path):
    # Small, non-default values: each must reach the stage that uses it.
    workers, size, slices, angles, scans, iterations = 3, 12, 4, 10, 2, 7
    out = tmp_path / "results"
    cmd = [sys.executable, PIPELINE, "run", "--out", str(out), "--workers", str(workers),
           "--size", str(size), "--slices", str(slices), "--angles", str(angles),
           "--scans", str(scans), "--iterations", str(iterations)]
    for attempt in (1, 2):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, f"run {attempt} failed:\n{r.stdout}\n{r.stderr}"
        assert "Traceback" not in r.stderr, r.stderr
        received = [json.loads(line) for line in (out / "received.jsonl").read_text().splitlines()]
        assert sorted((e["scan"], e["slice"]) for e in received) == [
            (j, s) for j in range(scans) for s in range(slices)
        ], f"run {attempt}: slices lost, repeated or left over from run 1"
        assert {e["partition"] for e in received} == set(range(workers))
        assert {(e["n_angles"], e["iterations"]) for e in received} == {(angles, iterations)}
        images = sorted(out.glob("scan*_slice*.npy"))
        assert len(images) == scans * slices
        assert {np.load(f).shape for f in images} == {(size, size)}
    assert "replacing the results of an earlier run" in r.stdout
