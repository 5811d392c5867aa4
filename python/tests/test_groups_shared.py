"""Shared consumer groups across processes, against a real `strom server`:
worker processes take tasks from one partition, ack them out of order, and
survive a worker's SIGKILL, a poison task that crashes workers, and the
server's own SIGKILL and restart.

Each worker logs, one line per fact, to its own file:
`D i deliveries` when a task is delivered, `S i` when its ack is sent,
`A i` once the ack is confirmed durable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import strom

WORKER = textwrap.dedent(
    """
    import os, random, sys, time, strom
    group_file, log_path, work_s, poison, prefetch = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    d = strom.Driver.connect(group_file)
    c = d.open_topic("tasks").consumer(
        group="g", mode="shared", prefetch=prefetch, visibility_timeout=30.0, max_deliveries=3
    )
    rng = random.Random(os.getpid())
    with open(log_path, "a", buffering=1) as log:
        while (batch := c.pull_batch(16, timeout=30.0)) is not None:
            for ev in batch:
                i = ev.metadata["i"]
                log.write(f"D {i} {ev.deliveries}\\n")
                if i == poison:
                    log.flush()
                    os._exit(3)  # the task crashes its worker
            time.sleep(work_s * len(batch))
            rng.shuffle(batch)  # ack out of order
            acks = []
            for ev in batch:
                log.write(f"S {ev.metadata['i']}\\n")
                acks.append((ev.metadata["i"], ev.ack()))
            for i, a in acks:
                a.wait(timeout=60.0)
                log.write(f"A {i}\\n")
    """
)


def produce(group_file: Path, n: int) -> None:
    d = strom.Driver.connect(group_file)
    t = d.create_topic("tasks", 1)
    p = t.producer(lease=None)
    futs = [p.push({"i": i}) for i in range(n)]
    for f in futs:
        f.wait(timeout=60.0)
    p.close()


def spawn(group_file: Path, log: Path, work_s: float = 0.0, poison: int = -1, prefetch: int = 32):
    args = [str(group_file), str(log), str(work_s), str(poison), str(prefetch)]
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, *args],
        stderr=subprocess.PIPE,
        text=True,
    )


def read_log(path: Path):
    delivered, sent, acked = [], set(), []
    if not path.exists():
        return delivered, sent, acked
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue  # a line cut by SIGKILL
        if parts[0] == "D" and len(parts) == 3:
            delivered.append((int(parts[1]), int(parts[2])))
        elif parts[0] == "S":
            sent.add(int(parts[1]))
        elif parts[0] == "A":
            acked.append(int(parts[1]))
    return delivered, sent, acked


def count_acked(logs) -> int:
    return sum(len(read_log(p)[2]) for p in logs)


def wait_until(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def finish(proc, timeout: float = 120.0) -> int:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"a worker did not finish: {proc.stderr.read()}")
    return proc.returncode


def test_four_workers_one_killed_every_task_acked_once(server, tmp_path):
    n = 20_000
    produce(server.group_file, n)
    logs = [tmp_path / f"w{k}.log" for k in range(4)]
    workers = [spawn(server.group_file, log, work_s=0.0005) for log in logs]
    wait_until(lambda: count_acked(logs) >= 0.4 * n, 120, "40% of the tasks acked")
    workers[0].send_signal(signal.SIGKILL)
    workers[0].wait()
    for w in workers[1:]:
        assert finish(w) == 0, w.stderr.read()

    entries = [read_log(p) for p in logs]
    acked = Counter(i for _, _, a in entries for i in a)
    killed_delivered, killed_sent, killed_acked = entries[0]
    # Acks the killed worker sent without seeing the answer: the server may
    # have made them durable (then the task is done, not redelivered) or not.
    unconfirmed = killed_sent - set(killed_acked)
    missing = set(range(n)) - set(acked) - unconfirmed
    assert not missing, f"{len(missing)} tasks never acked: {sorted(missing)[:10]}"
    twice = [i for i, c in acked.items() if c > 1]
    assert not twice, f"confirmed acks of the same task twice: {twice[:10]}"

    survivors = {}
    for delivered, _, _ in entries[1:]:
        for i, d in delivered:
            survivors.setdefault(i, []).append(d)
    # What the dead worker held and never acked came back, counted.
    held = {i for i, _ in killed_delivered} - killed_sent
    for i in held:
        assert i in survivors, f"task {i} held by the killed worker was lost"
        assert max(survivors[i]) >= 2, f"task {i} came back with deliveries {survivors[i]}"
    redelivered = [i for i, ds in survivors.items() if max(ds) >= 2]
    assert redelivered, "the killed worker held tasks; some must come back"
    # A confirmed ack is never delivered again.
    for i in killed_acked:
        assert i not in survivors, f"task {i} was delivered after its ack was confirmed"

    # The group resolved everything, unconfirmed acks included.
    g = strom.Driver.connect(server.group_file).describe_group("g")
    assert g["lag"] == 0 and g["pending"] == 0, g
    assert g["redelivered"] >= len(held), g


def test_a_poison_task_lands_in_the_dead_letter_topic(server, tmp_path):
    produce(server.group_file, 50)
    poison = 7
    crashes = 0
    finished = False
    k = 0
    while not finished:
        assert crashes <= 6, "the poison task kept crashing workers"
        # Every event handed to a member counts as a delivery, prefetched
        # or not: a worker that may crash on a task holds only that task.
        w = spawn(server.group_file, tmp_path / f"p{k}.log", poison=poison, prefetch=1)
        k += 1
        code = finish(w)
        if code == 3:
            crashes += 1
        else:
            assert code == 0, w.stderr.read()
            finished = True
    assert crashes == 3, f"max_deliveries=3: three workers died on it, not {crashes}"
    d = strom.Driver.connect(server.group_file)
    dlq = d.open_topic("tasks.g.dlq").consumer("inspect", start="beginning")
    dead = dlq.pull(timeout=10.0)
    assert dead is not None
    assert dead.metadata["metadata"] == {"i": poison}
    assert dead.metadata["deliveries"] == 3
    assert d.describe_group("g")["dead_lettered"] == 1
    acked = Counter(i for p in tmp_path.glob("p*.log") for i in read_log(p)[2])
    assert set(acked) == set(range(50)) - {poison}


def test_server_kill_9_mid_run_redelivers_only_unacked(server, tmp_path):
    n = 3000
    produce(server.group_file, n)
    first = [tmp_path / f"a{k}.log" for k in range(2)]
    workers = [spawn(server.group_file, log, work_s=0.0005) for log in first]
    wait_until(lambda: count_acked(first) >= n // 2, 120, "half the tasks acked")
    server.kill()
    for w in workers:
        w.kill()
        w.wait()
    confirmed = {i for p in first for i in read_log(p)[2]}
    in_flight = {i for p in first for i in read_log(p)[1]} - confirmed

    server.start()
    second = [tmp_path / f"b{k}.log" for k in range(2)]
    workers = [spawn(server.group_file, log) for log in second]
    for w in workers:
        assert finish(w) == 0, w.stderr.read()
    after = [read_log(p) for p in second]
    redelivered = {i for delivered, _, _ in after for i, _ in delivered}
    assert not (redelivered & confirmed), (
        f"acked tasks came back after the restart: {sorted(redelivered & confirmed)[:10]}"
    )
    acked_after = {i for _, _, a in after for i in a}
    missing = set(range(n)) - confirmed - acked_after - in_flight
    assert not missing, f"unacked tasks lost in the restart: {sorted(missing)[:10]}"
    g = strom.Driver.connect(server.group_file).describe_group("g")
    assert g["lag"] == 0, g
