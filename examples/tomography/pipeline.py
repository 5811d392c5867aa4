"""A 4-stage streaming tomography pipeline on Strom, one process per stage.

    DAQ  -> projections (1 partition)   2-D projections (slices x detector), small metadata
    DIST -> sinograms   (K partitions)  one sinogram row per (slice, angle); slice s -> partition s % K
    SIRT -> slices      (K partitions)  worker k reads partition k, reconstructs each slice (SIRT)
    DEN                                 reads every partition of `slices`, denoises, saves .npy

Every stage is a separate process talking to one ``strom server``; any stage
may start first (each creates the topics it needs if they are missing, and
consumers wait for data). The DAQ takes several scans (time steps); a SIRT
worker acks the last sinogram row of a scan only after that scan's slices
are stored, so a killed worker restarts from its acked offset. Slices it had
already pushed are found in its output partition at start-up and not pushed
again: no slice is lost or repeated.

Usage (each in its own shell, any order)::

    strom --group-file g.json server --data-dir d --listen 127.0.0.1:0 &
    python pipeline.py daq  --group-file g.json
    python pipeline.py dist --group-file g.json
    python pipeline.py sirt --group-file g.json --worker 0    # ... up to K-1
    python pipeline.py den  --group-file g.json --out results/
    python pipeline.py finish --group-file g.json   # once the workers are done

or everything at once: ``python pipeline.py run --out results/``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import strom

PROJECTIONS, SINOGRAMS, SLICES = "projections", "sinograms", "slices"


# ------------------------------------------------------------------ physics


def system_matrix(n: int, n_angles: int) -> np.ndarray:
    """Parallel-beam projector: (n_angles * n) x (n * n), ray-sampled."""
    angles = np.linspace(0.0, np.pi, n_angles, endpoint=False)
    c = (n - 1) / 2.0
    t = (np.arange(n) - c)[:, None]  # detector bins
    s = np.linspace(-1.5 * c, 1.5 * c, 4 * n)[None, :]  # samples along each ray
    ds = s[0, 1] - s[0, 0]
    a = np.zeros((n_angles, n, n * n), dtype=np.float64)
    for ai, th in enumerate(angles):
        x = np.rint(t * np.cos(th) - s * np.sin(th) + c).astype(int)
        y = np.rint(t * np.sin(th) + s * np.cos(th) + c).astype(int)
        ok = (x >= 0) & (x < n) & (y >= 0) & (y < n)
        rows = np.broadcast_to(np.arange(n)[:, None], x.shape)[ok]
        np.add.at(a[ai], (rows, y[ok] * n + x[ok]), ds)
    return a.reshape(n_angles * n, n * n)


def phantom(n: int, slice_index: int, scan: int) -> np.ndarray:
    """A small test object: two disks that move a little from scan to scan."""
    yy, xx = np.mgrid[0:n, 0:n] - (n - 1) / 2.0
    img = np.zeros((n, n))
    img[xx**2 + yy**2 < (0.35 * n) ** 2] = 0.5
    cx = 0.15 * n * np.cos(0.7 * slice_index + 0.5 * scan)
    img[(xx - cx) ** 2 + yy**2 < (0.12 * n) ** 2] = 1.0
    return img


def sirt(a: np.ndarray, b: np.ndarray, iterations: int) -> np.ndarray:
    """Simultaneous Iterative Reconstruction Technique, non-negative."""
    r = 1.0 / np.maximum(a.sum(axis=1), 1e-9)
    c = 1.0 / np.maximum(a.sum(axis=0), 1e-9)
    x = np.zeros(a.shape[1])
    for _ in range(iterations):
        x += c * (a.T @ (r * (b - a @ x)))
        np.maximum(x, 0.0, out=x)
    return x


def denoise(img: np.ndarray) -> np.ndarray:
    """3x3 mean filter."""
    p = np.pad(img, 1, mode="edge")
    n0, n1 = img.shape
    return sum(p[i : i + n0, j : j + n1] for i in range(3) for j in range(3)) / 9.0


# ------------------------------------------------------------------ plumbing


def connect(args) -> strom.Driver:
    return strom.Driver.connect(args.group_file)


def ensure_topics(driver: strom.Driver, k: int) -> None:
    """Creates the pipeline's topics unless they exist (any stage may be first).
    A stage started with another --workers than the topics were made with
    stops with TopicExists, saying how many partitions they have."""
    for name, parts, selector in ((PROJECTIONS, 1, "round-robin"), (SINOGRAMS, k, "explicit"), (SLICES, k, "explicit")):
        driver.create_topic(name, parts, selector=selector, exist_ok=True)


def log(stage: str, msg: str) -> None:
    print(f"[{stage}] {msg}", flush=True)


# ------------------------------------------------------------------ stages


def daq(args) -> None:
    """Acquires `scans` x `angles` projections and pushes each as a 2-D array."""
    d = connect(args)
    ensure_topics(d, args.workers)
    n, n_angles = args.size, args.angles
    a = system_matrix(n, n_angles).reshape(n_angles, n, n * n)
    with d.open_topic(PROJECTIONS).producer() as p:
        for scan in range(args.scans):
            objects = np.stack([phantom(n, s, scan).ravel() for s in range(args.slices)])  # (slices, n*n)
            for ai in range(n_angles):
                proj = (objects @ a[ai].T).astype("<f4")  # (slices, detector)
                meta = {"scan": scan, "angle_index": ai, "n_angles": n_angles, "n_slices": args.slices, "n_scans": args.scans}
                p.push(meta, proj)
    log("daq", f"pushed {args.scans * n_angles} projections")


def dist(args) -> None:
    """Splits projections into sinogram rows: slice s goes to partition s % K."""
    d = connect(args)
    ensure_topics(d, args.workers)
    k = d.open_topic(SINOGRAMS).partitions
    out = d.open_topic(SINOGRAMS).producer()
    rows = 0
    for ev in d.open_topic(PROJECTIONS).consumer("dist"):
        m, proj = ev.metadata, ev.data  # proj: (slices, detector) float32, zero-copy
        for s in range(proj.shape[0]):
            meta = dict(m, slice=s)
            out.push(meta, proj[s], partition=s % k)  # a row view: no copy
            rows += 1
        out.flush()
        ev.ack()
    out.close()
    log("dist", f"pushed {rows} sinogram rows")


def done_slices(d: strom.Driver, k: int) -> set[tuple[int, int]]:
    """(scan, slice) pairs already stored in output partition k."""
    info = d.describe(SLICES)["partitions"][k]
    have, n = set(), info["next_offset"] - info["first_offset"]
    if n == 0:
        return have
    c = d.open_topic(SLICES).consumer(f"sirt-{k}-recovery", partitions=[k], start="beginning",
                                      data_selector=strom.select.none())
    for _ in range(n):
        m = c.pull(timeout=60).metadata
        have.add((m["scan"], m["slice"]))
    c.close()
    return have


def sirt_worker(args) -> None:
    """Reconstructs the slices of one sinogram partition, scan by scan."""
    d = connect(args)
    ensure_topics(d, args.workers)
    k = args.worker
    already = done_slices(d, k)
    committed = d.consumer_offsets(SINOGRAMS, k).get(f"sirt-{k}", 0)
    log("sirt", f"worker {k} starts: committed offset {committed}, {len(already)} slices already stored")
    out = d.open_topic(SLICES).producer()
    a_cache: dict[tuple[int, int], np.ndarray] = {}
    pending: dict[tuple[int, int], dict[int, np.ndarray]] = {}
    first = None
    for ev in d.open_topic(SINOGRAMS).consumer(f"sirt-{k}", partitions=[k]):
        if first is None:
            first = ev.offset
            log("sirt", f"worker {k} resumed at offset {first}")
        m = ev.metadata
        key = (m["scan"], m["slice"])
        pending.setdefault(key, {})[m["angle_index"]] = np.array(ev.data)
        if len(pending[key]) < m["n_angles"]:
            continue
        rows = pending.pop(key)
        if key not in already:
            n = rows[0].shape[0]
            a = a_cache.setdefault((n, m["n_angles"]), system_matrix(n, m["n_angles"]))
            b = np.concatenate([rows[i] for i in range(m["n_angles"])]).astype(np.float64)
            img = sirt(a, b, args.iterations).reshape(n, n).astype("<f4")
            out.push({"scan": key[0], "slice": key[1], "worker": k, "n_slices": m["n_slices"],
                      "n_scans": m["n_scans"], "n_angles": m["n_angles"], "iterations": args.iterations},
                     img, partition=k).wait()
            if args.slow:
                time.sleep(args.slow)
        if not any(s == key[0] for s, _ in pending):
            # Every slice of this scan in this partition is stored: commit.
            ev.ack().wait()
    # Flushed, not closed: closing the last open producer would end the
    # `slices` stream, and a worker done early would end it for workers still
    # starting up. `finish` ends it once every worker is done.
    out.flush()
    log("sirt", f"worker {k} done")


def den(args) -> None:
    """Denoises every reconstructed slice and saves it under --out."""
    d = connect(args)
    ensure_topics(d, args.workers)
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    received = open(outdir / "received.jsonl", "a")
    count = 0
    for ev in d.open_topic(SLICES).consumer("den"):
        m = ev.metadata
        np.save(outdir / f"scan{m['scan']}_slice{m['slice']}.npy", denoise(ev.data))
        received.write(json.dumps({"scan": m["scan"], "slice": m["slice"], "worker": m["worker"],
                                   "partition": ev.partition, "offset": ev.offset,
                                   "n_angles": m["n_angles"], "iterations": m["iterations"]}) + "\n")
        received.flush()
        ev.ack()
        count += 1
    log("den", f"denoised {count} slices")


def finish(args) -> None:
    """Ends the `slices` stream once every SIRT worker is done (a killed
    worker's producer never closes, so the workflow manager completes it)."""
    connect(args).open_topic(SLICES).complete()


# The options `run` hands to every stage it starts.
SIZE_OPTIONS = ("workers", "size", "slices", "angles", "scans", "iterations")


def run(args) -> None:
    """Starts a server and every stage as its own process, then finishes.

    Each run is self-contained: its server starts afresh in ``--out/server``,
    and the results of an earlier run in ``--out`` are replaced."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    earlier = [out / "received.jsonl", *out.glob("scan*_slice*.npy")]
    if (out / "server").exists() or any(f.exists() for f in earlier):
        log("run", f"replacing the results of an earlier run in {out}")
        shutil.rmtree(out / "server", ignore_errors=True)
        for f in earlier:
            f.unlink(missing_ok=True)
    with strom.testing.Server(out / "server") as server:
        common = ["--group-file", str(server.group_file)]
        for name in SIZE_OPTIONS:
            common += [f"--{name}", str(getattr(args, name))]
        me = [sys.executable, __file__]
        workers = [subprocess.Popen(me + ["sirt", "--worker", str(k)] + common) for k in range(args.workers)]
        den_p = subprocess.Popen(me + ["den", "--out", str(out)] + common)
        others = [subprocess.Popen(me + [s] + common) for s in ("dist", "daq")]
        failed = [p.args[2] for p in workers + others if p.wait() != 0]
        if failed:
            den_p.kill()
            den_p.wait()
            sys.exit(f"run: the {', '.join(failed)} stage(s) failed; see their messages above")
        subprocess.run(me + ["finish"] + common, check=True)
        if den_p.wait() != 0:
            sys.exit("run: the den stage failed; see its messages above")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stage", choices=["daq", "dist", "sirt", "den", "finish", "run"])
    ap.add_argument("--group-file", default=None)
    ap.add_argument("--workers", type=int, default=2, help="K: sinogram partitions and SIRT workers")
    ap.add_argument("--worker", type=int, default=0, help="which SIRT worker (partition) this is")
    ap.add_argument("--size", type=int, default=32, help="detector bins = image side")
    ap.add_argument("--slices", type=int, default=8)
    ap.add_argument("--angles", type=int, default=24)
    ap.add_argument("--scans", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=30, help="SIRT iterations")
    ap.add_argument("--slow", type=float, default=0.0, help="seconds to pause after each slice (tests)")
    ap.add_argument("--out", default="tomography-out")
    args = ap.parse_args(argv)
    stages = {"daq": daq, "dist": dist, "sirt": sirt_worker, "den": den, "finish": finish, "run": run}
    if args.stage == "run":
        import strom.testing  # noqa: F401 - starts the server
    stages[args.stage](args)


if __name__ == "__main__":
    main()
