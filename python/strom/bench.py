"""``python -m strom.bench``: what Strom costs from Python, next to the Rust
client on the same workload in the same process.

* **push overhead**: time of one ``Producer.push`` call (adaptive batching)
  for an event with ~100 bytes of metadata and no data; median and p99, for
  dict and str metadata, and for the Rust client's ``push``.
* **consume throughput**: events/s and MB/s of a Python consumer loop
  (``for ev in consumer: ev.data``) over 1 KiB events, and of the Rust
  client's pull loop over the same topic.

It prints numbers; it asserts nothing. ``--smoke`` runs a tiny version.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from . import Driver, _strom

META_DICT = {"run": "tomo-0001", "step": 0, "kind": "projection", "angle": 0.125, "detector": "det-A", "ok": True}


def _meta(i: int) -> dict:
    m = dict(META_DICT)
    m["step"] = i
    return m


def _percentiles(ns: list[int]) -> tuple[float, float]:
    s = sorted(ns)
    return statistics.median(s) / 1000, s[min(len(s) - 1, int(len(s) * 0.99))] / 1000


def bench_push(driver: Driver, events: int) -> dict:
    import json

    results = {}
    meta_text = json.dumps(META_DICT)
    perf = time.perf_counter_ns
    for label, make in (("dict", _meta), ("str", lambda i: meta_text)):
        topic = driver.create_topic(f"bench-push-{label}", 1, type="memory")
        p = topic.producer()
        metas = [make(i) for i in range(events)]
        times = [0] * events
        for i, m in enumerate(metas):
            t0 = perf()
            p.push(m)
            times[i] = perf() - t0
        p.flush()
        p.close()
        results[label] = _percentiles(times)
    topic = driver.create_topic("bench-push-rust", 1, type="memory")
    results["rust"] = _percentiles(_strom.rust_push(topic, meta_text, events))
    results["meta_bytes"] = len(meta_text)
    return results


def bench_consume(driver: Driver, events: int, size: int) -> dict:
    topic = driver.create_topic("bench-consume", 1, type="memory")
    payload = b"\xab" * size
    p = topic.producer()
    for i in range(events):
        p.push({"i": i}, payload)
    p.close()
    results = {}
    for rep in range(2):  # alternate, to even out machine noise
        c = topic.consumer(f"py-{rep}", start="beginning")
        t0 = time.perf_counter()
        n = nbytes = 0
        for ev in c:
            nbytes += len(ev.data)
            n += 1
        dt = time.perf_counter() - t0
        c.close()
        assert n == events and nbytes == events * size
        results.setdefault("python", []).append(n / dt)
        rn, rbytes, rdt = _strom.rust_consume(topic, f"rust-{rep}", events)
        assert rn == events and rbytes == events * size
        results.setdefault("rust", []).append(rn / rdt)
    return {k: max(v) for k, v in results.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m strom.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--push-events", type=int, default=200_000)
    ap.add_argument("--consume-events", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024, help="data bytes per consumed event")
    ap.add_argument("--smoke", action="store_true", help="a tiny run (for tests)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.push_events, args.consume_events = 2_000, 2_000
    with tempfile.TemporaryDirectory(prefix="strom-bench-") as tmp:
        driver = Driver.embedded(tmp)
        push = bench_push(driver, args.push_events)
        print(f"push overhead, {args.push_events} events, {push['meta_bytes']} B metadata, no data, adaptive batching:")
        for label in ("dict", "str", "rust"):
            med, p99 = push[label]
            who = "rust client" if label == "rust" else f"python, {label} metadata"
            print(f"  {who:<26} median {med:6.2f} us   p99 {p99:7.2f} us")
        cons = bench_consume(driver, args.consume_events, args.size)
        print(f"consume, {args.consume_events} events of {args.size} B from a memory partition:")
        for label in ("python", "rust"):
            rate = cons[label]
            print(f"  {label + ' client':<26} {rate:12,.0f} events/s   {rate * args.size / 1e6:8.1f} MB/s")
        print(f"  python / rust              {cons['python'] / cons['rust']:.2f}")
        del driver


if __name__ == "__main__":
    main()
