#!/usr/bin/env python3
"""Workflow provenance from Dask, measured (docs/provenance.md).

A parameter sweep on a local Dask cluster (2 worker processes, 1 thread
each): for each parameter a `simulate` task (a few milliseconds of numpy)
and a `score` task on its result, then one `best` over all scores. Each
round runs the sweep with capture off, with provenance published to Strom
(`strom.dask.ProvenancePlugin`), and, given `--kafka HOST:PORT`, to Kafka
(the same plugin with a Kafka sink: confluent-kafka, acks=all, linger 5 ms),
in turn on the same cluster. The overhead of a sink is its median workflow
time over the median with capture off.

    python sweep.py --params 1500 --rounds 5 --kafka 127.0.0.1:9092

Without `--group-file` it starts its own `strom server` (strom.testing).
It checks that each Strom run's topic holds one record per task, and that
Kafka acknowledged one per task. The last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from distributed import Client, LocalCluster

import strom
import strom.dask
import strom.testing


def simulate(p: int) -> float:
    """A small simulation: a few ms of linear algebra seeded by `p`."""
    rng = np.random.default_rng(p)
    a = rng.standard_normal((48, 48))
    for _ in range(6):
        a = np.tanh(a @ a.T / 48.0)
    return float(a.trace())


def score(x: float) -> float:
    return -abs(x - 10.0)


def best(scores: list) -> float:
    return max(scores)


class KafkaSink:
    """Records as JSON to a Kafka topic (confluent-kafka, acks=all)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.delivered = 0
        self.failed = 0
        self._p = None

    def __getstate__(self):
        return {**self.__dict__, "_p": None}

    def open(self) -> None:
        from confluent_kafka import Producer

        self._p = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5, "acks": "all"})

    def _done(self, err, _msg) -> None:
        if err is None:
            self.delivered += 1
        else:
            self.failed += 1

    def publish(self, record: dict) -> None:
        self._p.produce(self.topic, json.dumps(record).encode(), on_delivery=self._done)
        self._p.poll(0)

    def close(self) -> None:
        if self._p is not None:
            self._p.flush(60)
            self._p = None


def sweep(client: Client, params: int) -> float:
    """Runs the workflow; its wall time in seconds."""
    t0 = time.perf_counter()
    sims = client.map(simulate, range(params))
    scores = client.map(score, sims)
    result = client.submit(best, scores).result()
    elapsed = time.perf_counter() - t0
    assert result <= 0.0
    client.cancel(sims + scores)
    return elapsed


def with_capture(client: Client, cluster: LocalCluster, plugin, params: int) -> tuple[float, object]:
    """One run with `plugin` registered; its time and the plugin's sink,
    closed once the run is over (outside the timed part)."""
    client.register_plugin(plugin)
    elapsed = sweep(client, params)
    live = cluster.scheduler.plugins[plugin.name]
    client.unregister_scheduler_plugin(plugin.name)
    live.sink.close()
    return elapsed, live.sink


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=int, default=1500, help="parameters (tasks = 2 x params + 1)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--group-file", help="a running Strom group (else one is started here)")
    ap.add_argument("--kafka", help="HOST:PORT of a Kafka broker to compare with")
    args = ap.parse_args()
    tasks = 2 * args.params + 1
    tmp = tempfile.TemporaryDirectory(prefix="strom-provenance-")
    server = None
    group_file = args.group_file
    if group_file is None:
        server = strom.testing.Server(Path(tmp.name) / "server")
        group_file = str(server.group_file)
    modes = ["off", "strom"] + (["kafka"] if args.kafka else [])
    times: dict[str, list[float]] = {m: [] for m in modes}
    try:
        with LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster, Client(cluster) as client:
            sweep(client, min(args.params, 100))  # warm the workers up
            for r in range(args.rounds):
                for mode in modes:
                    topic = f"prov.{int(time.time())}.{r}"
                    if mode == "off":
                        elapsed = sweep(client, args.params)
                    elif mode == "strom":
                        plugin = strom.dask.ProvenancePlugin(topic=topic, group_file=group_file)
                        elapsed, sink = with_capture(client, cluster, plugin, args.params)
                        got = len(strom.dask.read_topic(topic, group_file=group_file, timeout=60))
                        assert got == tasks and sink.failed == 0, (got, tasks, sink.failed)
                    else:
                        plugin = strom.dask.ProvenancePlugin(KafkaSink(args.kafka, topic))
                        elapsed, sink = with_capture(client, cluster, plugin, args.params)
                        assert sink.delivered == tasks and sink.failed == 0, (sink.delivered, tasks)
                    times[mode].append(elapsed)
                    print(json.dumps({"round": r, "mode": mode, "tasks": tasks, "seconds": round(elapsed, 4)}), flush=True)
    finally:
        if server is not None:
            server.stop()
        tmp.cleanup()
    off = statistics.median(times["off"])
    summary = {"tasks": tasks, "rounds": args.rounds, "median_s": {}, "overhead_pct": {}}
    print(f"{'capture':8} {'median s':>9} {'overhead':>9}   ({tasks} tasks, medians of {args.rounds})")
    for m in modes:
        med = statistics.median(times[m])
        summary["median_s"][m] = round(med, 4)
        if m != "off":
            summary["overhead_pct"][m] = round(100.0 * (med - off) / off, 2)
        over = "" if m == "off" else f"{100.0 * (med - off) / off:+8.2f}%"
        print(f"{m:8} {med:9.3f} {over:>9}")
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
