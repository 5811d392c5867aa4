#!/usr/bin/env python3
"""A Python task queue with one task in flight: the round trip of a task
from a dispatcher to a worker and of its result back, through Strom and
through Redis Streams, in the same run.

The dispatcher pushes task i (a small JSON object), waits for its result,
records the time from before the push to the result in hand, and only
then pushes task i + 1. The worker, another process, takes each task,
pushes a result naming it, and acks the task. No work is simulated: the
figure is the queue's own cost, what a steering loop or an active-learning
loop that waits for each evaluation pays per task. Systems:

* ``strom-shared``    tasks through a shared consumer group (``group=``,
                      ``mode="shared"``, the work-queue mode): the worker
                      acks each task once its result is stored
                      (``ev.ack_when(results.push(r))``).
* ``strom-plain``     the worker reads the tasks as a plain named consumer
                      (hand-partitioned: one worker per partition) and acks
                      each the same way.
* ``redis-group``     Redis Streams: ``XADD tasks``; the worker
                      ``XREADGROUP ... BLOCK 0 COUNT 1``, ``XADD results``,
                      ``XACK``; the dispatcher ``XREAD BLOCK 0`` on results.
* ``redis-plain``     the worker ``XREAD BLOCK 0``s the tasks stream
                      (hand-partitioned), no group, no ack.

Strom: one `strom server` child process (TCP on 127.0.0.1 and, since
servers serve it by default, shm: same-node clients take shm), memory
topics of one partition. Redis: a `redis-server` child process without
persistence (`--save '' --appendonly no`), redis-py from
bench/.work/redis-py (``bench/peers/redis/install-py``). Both in memory,
both on this node. ``STROM_TRANSPORT=tcp`` makes the Strom clients take TCP
as Redis's do.

    python/.venv/bin/python bench/python/taskqueue_latency.py            # every system
    python/.venv/bin/python bench/python/taskqueue_latency.py --tasks 5000 --reps 5
    python/.venv/bin/python bench/python/taskqueue_latency.py --smoke    # tiny, for tests

Repetitions interleave the systems; the table gives the median over
repetitions of each repetition's p50, p99 and mean, and each system's p50
over Redis's in the same mode (shared with redis-group, plain with
redis-plain). Every result must name the task just sent; a run that
gets another, or none within 30 s, fails and the program exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from pipeline import StromServer, strom_binary  # noqa: E402

REDIS_PY = HERE.parent / ".work" / "redis-py"
SYSTEMS = ("strom-shared", "strom-plain", "redis-group", "redis-plain")
WAIT_S = 30.0


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def redis_module():
    try:
        import redis
    except ImportError:
        sys.path.insert(0, str(REDIS_PY))
        import redis
    return redis


# --- the worker ----------------------------------------------------------------

def strom_worker(endpoint, tasks_topic, results_topic, shared, ready, out):
    try:
        import strom

        d = strom.Driver.connect(endpoint)
        if shared:
            c = d.open_topic(tasks_topic).consumer("w", group="workers", mode="shared")
        else:
            c = d.open_topic(tasks_topic).consumer("w", start="beginning")
        results = d.open_topic(results_topic).producer()
        ready.set()
        n = 0
        while True:
            ev = c.pull(timeout=WAIT_S)
            if ev is None:
                break  # end of stream: the dispatcher closed its producer
            ev.ack_when(results.push(ev.raw_metadata))
            n += 1
        results.close()
        out.put(("worker", {"tasks": n}))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        ready.set()
        out.put(("worker", {"error": f"{type(e).__name__}: {e}"}))


def redis_worker(endpoint, tasks_topic, results_topic, shared, ready, out):
    try:
        redis = redis_module()
        host, port = endpoint.rsplit(":", 1)
        r = redis.Redis(host=host, port=int(port))
        if shared:
            r.xgroup_create(tasks_topic, "workers", id="0", mkstream=True)
        ready.set()
        n, last = 0, "0"
        while True:
            if shared:
                got = r.xreadgroup("workers", "w", {tasks_topic: ">"}, count=1,
                                   block=int(WAIT_S * 1000))
            else:
                got = r.xread({tasks_topic: last}, count=1, block=int(WAIT_S * 1000))
            if not got:
                raise RuntimeError(f"no task for {WAIT_S:.0f} s after {n}")
            (_stream, entries), = got
            (eid, fields), = entries
            if fields.get(b"end"):
                break
            r.xadd(results_topic, {b"t": fields[b"t"]})
            if shared:
                r.xack(tasks_topic, "workers", eid)
            last = eid
            n += 1
        out.put(("worker", {"tasks": n}))
    except BaseException as e:  # noqa: BLE001
        ready.set()
        out.put(("worker", {"error": f"{type(e).__name__}: {e}"}))


# --- the dispatcher (in this process) ----------------------------------------------

class StromSide:
    def __init__(self, server, tag):
        import strom

        self.d = strom.Driver.connect(str(server.group))
        self.endpoint = str(server.group)
        self.tasks, self.results = f"tasks-{tag}", f"results-{tag}"
        for t in (self.tasks, self.results):
            self.d.create_topic(t, 1, type="memory")
        self.p = self.d.open_topic(self.tasks).producer(lease=None)
        self.c = self.d.open_topic(self.results).consumer("dispatcher", start="beginning")

    def round_trip(self, i: int) -> int:
        t0 = now_ns()
        self.p.push(b'{"t":%d}' % i)
        ev = self.c.pull(timeout=WAIT_S)
        t1 = now_ns()
        if ev is None or json.loads(ev.raw_metadata) != {"t": i}:
            raise RuntimeError(f"task {i}: result {None if ev is None else ev.raw_metadata!r}")
        ev.ack()
        return t1 - t0

    def close(self):
        self.p.close()  # ends the task stream: the worker's pull returns None

    def cleanup(self):
        self.c.close()
        for t in (self.tasks, self.results):
            self.d.delete_topic(t)


class RedisSide:
    def __init__(self, endpoint, tag):
        redis = redis_module()
        host, port = endpoint.rsplit(":", 1)
        self.r = redis.Redis(host=host, port=int(port))
        self.endpoint = endpoint
        self.tasks, self.results = f"tasks-{tag}", f"results-{tag}"
        self.last = "0"

    def round_trip(self, i: int) -> int:
        t0 = now_ns()
        self.r.xadd(self.tasks, {b"t": i})
        got = self.r.xread({self.results: self.last}, count=1, block=int(WAIT_S * 1000))
        t1 = now_ns()
        if not got:
            raise RuntimeError(f"task {i}: no result")
        (_s, entries), = got
        (eid, fields), = entries
        if int(fields[b"t"]) != i:
            raise RuntimeError(f"task {i}: result {fields!r}")
        self.last = eid
        return t1 - t0

    def close(self):
        self.r.xadd(self.tasks, {b"end": 1})

    def cleanup(self):
        self.r.delete(self.tasks, self.results)


class RedisServer:
    def __init__(self, directory: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.endpoint = f"127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--dir", str(directory),
             "--save", "", "--appendonly", "no", "--protected-mode", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start")
                time.sleep(0.05)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


# --- one run -------------------------------------------------------------------------

def one_run(system, servers, tasks, warm, ctx) -> dict:
    tag = f"{system}-{time.monotonic_ns()}"
    side = (StromSide(servers["strom"], tag) if system.startswith("strom")
            else RedisSide(servers["redis"].endpoint, tag))
    shared = system.endswith("shared") or system.endswith("group")
    target = strom_worker if system.startswith("strom") else redis_worker
    ready, out = ctx.Event(), ctx.Queue()
    w = ctx.Process(target=target, args=(side.endpoint, side.tasks, side.results, shared,
                                         ready, out))
    w.start()
    run = {"system": system, "tasks": tasks, "warmup": warm}
    try:
        if not ready.wait(WAIT_S):
            raise RuntimeError("worker not ready")
        times = [side.round_trip(i) for i in range(warm + tasks)][warm:]
        side.close()
        who, v = out.get(timeout=WAIT_S)
        if "error" in v:
            raise RuntimeError(f"worker: {v['error']}")
        if v["tasks"] != warm + tasks:
            raise RuntimeError(f"the worker did {v['tasks']} tasks of {warm + tasks}")
        us = sorted(t / 1000 for t in times)
        run.update(p50_us=us[len(us) // 2], p99_us=us[min(len(us) - 1, len(us) * 99 // 100)],
                   mean_us=statistics.fmean(us))
    except Exception as e:  # noqa: BLE001
        run.update(failed=True, error=f"{type(e).__name__}: {e}")
    finally:
        w.join(10)
        if w.is_alive():
            w.kill()
            w.join()
        try:
            side.cleanup()
        except Exception:  # noqa: BLE001
            pass
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--tasks", type=int, default=2000, help="timed tasks per run (default 2000)")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="also print one JSON object (last line)")
    ap.add_argument("--smoke", action="store_true", help="tiny: 50 tasks, 1 repetition")
    args = ap.parse_args(argv)
    if args.smoke:
        args.tasks, args.warmup, args.reps = 50, 5, 1
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    for s in systems:
        if s not in SYSTEMS:
            ap.error(f"unknown system {s!r} (of {', '.join(SYSTEMS)})")
    unavailable = {}
    if any(s.startswith("redis") for s in systems):
        why = None
        if not shutil.which("redis-server"):
            why = "no redis-server (bench/peers/redis/install)"
        else:
            try:
                redis_module()
            except ImportError:
                why = "redis-py is not importable: bench/peers/redis/install-py"
        if why:
            unavailable.update({s: why for s in systems if s.startswith("redis")})
    for s, why in unavailable.items():
        print(f"{s} left out: {why}", file=sys.stderr)
    systems = [s for s in systems if s not in unavailable]

    ctx = mp.get_context("spawn")
    tmp = Path(tempfile.mkdtemp(prefix="strom-taskq-"))
    servers, results = {}, []
    try:
        if any(s.startswith("strom") for s in systems):
            servers["strom"] = StromServer(strom_binary(), tmp / "strom", shm=True)
        if any(s.startswith("redis") for s in systems):
            (tmp / "redis").mkdir()
            servers["redis"] = RedisServer(tmp / "redis")
        for rep in range(args.reps):
            for s in systems:
                r = one_run(s, servers, args.tasks, args.warmup, ctx)
                r["rep"] = rep
                results.append(r)
                print(f"  rep {rep + 1} {s:<13} " + (f"FAILED: {r['error']}" if r.get("failed")
                      else f"p50 {r['p50_us']:8.1f} us  p99 {r['p99_us']:8.1f} us"),
                      file=sys.stderr, flush=True)
    finally:
        for srv in servers.values():
            srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    table = {}
    for s in systems:
        ok = [r for r in results if r["system"] == s and not r.get("failed")]
        if ok:
            table[s] = {k: statistics.median(r[k] for r in ok) for k in ("p50_us", "p99_us",
                                                                           "mean_us")}
    peer = {"strom-shared": "redis-group", "strom-plain": "redis-plain"}
    print(f"Python task queue, one task in flight: dispatcher -> worker -> dispatcher; "
          f"{args.tasks} tasks after {args.warmup} untimed; median of {args.reps} "
          f"repetition(s) of each run's figure; microseconds")
    print(f"{'system':<14} {'p50':>9} {'p99':>9} {'mean':>9}  p50 / Redis p50, same mode "
          "(below 1: Strom faster)")
    for s in systems:
        if s in table:
            t = table[s]
            base = table.get(peer.get(s), {}).get("p50_us")
            ratio = f"{t['p50_us'] / base:.2f} ({peer[s]})" if base else ""
            print(f"{s:<14} {t['p50_us']:>9.1f} {t['p99_us']:>9.1f} {t['mean_us']:>9.1f}  {ratio}")
        else:
            errs = sorted({r["error"] for r in results if r["system"] == s})
            print(f"{s:<14} FAILED: {'; '.join(errs)[:200]}")
    nfail = sum(1 for r in results if r.get("failed"))
    if args.json:
        print(json.dumps({"benchmark": "python-taskqueue-latency", "reps": args.reps,
                          "tasks": args.tasks, "systems": systems, "unavailable": unavailable,
                          "table": table, "runs": results, "failed_runs": nfail}))
    return 1 if nfail else 0


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    sys.exit(main())
