"""An AI-steered task queue on Strom: a dispatcher proposes candidate
parameters, a pool of workers evaluates them, and the dispatcher steers the
next generation from the results.

    tasks    (1 partition)  dispatcher -> workers, shared consumer group "workers"
    results  (1 partition)  workers -> dispatcher

Each task is one event: `{"task": id, "gen": g, "x": [..], "sent": t}`.
Workers are members of one *shared* consumer group: any worker may take any
task, each task is with one worker at a time, and a worker acks each task on
its own once its result is stored. A worker that dies (even SIGKILL) hands
its unacked tasks to the others (`ev.deliveries` > 1), so every task gets a
result; a task whose ack was lost in the crash may be evaluated twice, and
the dispatcher keeps the first result of each task.

    python taskqueue.py run --workers 4 --generations 5 --population 200
    python taskqueue.py dispatcher --group-file G ...   # or each role alone
    python taskqueue.py worker --group-file G
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import strom
import strom.testing

GROUP = "workers"


def objective(x: list[float]) -> float:
    """The function being minimised: a shifted Rastrigin-like bowl (a
    stand-in for a simulation or a model evaluation)."""
    return sum((v - 1.5) ** 2 + 0.5 * (1 - math.cos(4 * (v - 1.5))) for v in x)


def setup(d: strom.Driver) -> None:
    for name in ("tasks", "results"):
        try:
            d.create_topic(name, 1)
        except strom.StromError as e:
            if "exists" not in str(e):
                raise


def worker(args) -> None:
    d = strom.Driver.connect(args.group_file)
    setup(d)
    tasks = d.open_topic("tasks").consumer(
        name=args.name, group=GROUP, mode="shared", prefetch=args.prefetch
    )
    results = d.open_topic("results").producer()
    done = 0
    for ev in tasks:  # until the dispatcher ends the task stream
        t = ev.metadata
        if args.work_ms:
            time.sleep(args.work_ms / 1000.0)
        y = objective(t["x"])
        r = {"task": t["task"], "gen": t["gen"], "x": t["x"], "y": y,
             "sent": t["sent"], "deliveries": ev.deliveries}
        # Ack the task once its result is stored (at least once), without
        # waiting here: the loop takes the next task meanwhile.
        ev.ack_when(results.push(r))
        done += 1
    results.close()
    print(json.dumps({"worker": args.name, "tasks": done}), flush=True)


def dispatcher(args) -> dict:
    d = strom.Driver.connect(args.group_file)
    setup(d)
    tasks = d.open_topic("tasks").producer(lease=None)
    results = d.open_topic("results").consumer("dispatcher", start="end")
    rng = random.Random(args.seed)
    best: list[tuple[float, list[float]]] = []
    latencies, duplicates, redelivered = [], 0, 0
    next_id, t0 = 0, time.time()
    for gen in range(args.generations):
        # Steering: sample around the best results so far.
        ids = set()
        for _ in range(args.population):
            if best:
                _, parent = rng.choice(best[: max(1, len(best) // 4)])
                x = [v + rng.gauss(0, 0.5 / (gen + 1)) for v in parent]
            else:
                x = [rng.uniform(-5, 5) for _ in range(args.dim)]
            tasks.push({"task": next_id, "gen": gen, "x": x, "sent": time.time()})
            ids.add(next_id)
            next_id += 1
        tasks.flush()
        got = {}
        while len(got) < len(ids):
            ev = results.pull(timeout=args.timeout)
            if ev is None:
                raise RuntimeError("the results stream ended early")
            r = ev.metadata
            ev.ack()
            if r["task"] not in ids or r["task"] in got:
                duplicates += r["task"] in got
                continue
            got[r["task"]] = r
            latencies.append(time.time() - r["sent"])
            redelivered += r["deliveries"] > 1
        best = sorted(best + [(r["y"], r["x"]) for r in got.values()])[: args.population]
        print(json.dumps({"gen": gen, "best": round(best[0][0], 6), "results": len(got)}), flush=True)
    tasks.close()  # the end of the task stream: idle workers exit
    elapsed = time.time() - t0
    latencies.sort()
    pct = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]  # noqa: E731
    summary = {
        "tasks": next_id, "seconds": round(elapsed, 3),
        "tasks_per_s": round(next_id / elapsed, 1),
        "p50_ms": round(pct(0.50) * 1000, 3), "p99_ms": round(pct(0.99) * 1000, 3),
        "best": best[0][0], "duplicates": duplicates, "redelivered": redelivered,
    }
    print(json.dumps(summary), flush=True)
    return summary


def run(args) -> None:
    base = Path(args.dir or tempfile.mkdtemp(prefix="taskqueue-"))
    server = strom.testing.Server(base / "server")
    try:
        common = ["--group-file", str(server.group_file)]
        setup(strom.Driver.connect(server.group_file))
        workers = [
            subprocess.Popen([sys.executable, __file__, "worker", *common, "--name", f"w{k}",
                              "--work-ms", str(args.work_ms)])
            for k in range(args.workers)
        ]
        dispatcher(argparse.Namespace(**{**vars(args), "group_file": str(server.group_file)}))
        for w in workers:
            w.wait(timeout=120)
    finally:
        server.stop()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="role", required=True)
    for role in ("run", "dispatcher", "worker"):
        p = sub.add_parser(role)
        if role != "run":
            p.add_argument("--group-file", required=True)
        p.add_argument("--work-ms", type=float, default=0.0, help="simulated work per task")
        if role in ("run", "dispatcher"):
            p.add_argument("--generations", type=int, default=5)
            p.add_argument("--population", type=int, default=200)
            p.add_argument("--dim", type=int, default=4)
            p.add_argument("--seed", type=int, default=1)
            p.add_argument("--timeout", type=float, default=60.0)
        if role == "run":
            p.add_argument("--workers", type=int, default=4)
            p.add_argument("--dir", default=None)
        if role == "worker":
            p.add_argument("--name", default=None, help="label shown by `strom group describe`")
            p.add_argument("--prefetch", type=int, default=16)
    args = ap.parse_args(argv)
    {"run": run, "dispatcher": dispatcher, "worker": worker}[args.role](args)


if __name__ == "__main__":
    main()
