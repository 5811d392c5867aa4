"""Partitioned consumer groups across processes, against a real `strom
server`: three workers split a 6-partition topic, a fourth joins and the
partitions are rebalanced, one is killed with SIGKILL and its partitions
move to the others at their committed offsets. Every event is processed,
and an event is read twice only if the first reader had not acked it.

Workers log `ASSIGN p,..`, `REVOKE p,..`, `D p o` per event, and `A p o`
once an ack (covering every offset up to o of partition p) is confirmed."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter, defaultdict
from pathlib import Path

import strom

PARTITIONS = 6
WAVE = 1200

WORKER = textwrap.dedent(
    """
    import sys, strom
    group_file, log_path = sys.argv[1], sys.argv[2]
    log = open(log_path, "a", buffering=1)
    d = strom.Driver.connect(group_file)
    c = d.open_topic("pt").consumer(
        group="pg", session_timeout=2.0, prefetch=64,
        on_assigned=lambda ps: log.write("ASSIGN " + ",".join(map(str, ps)) + "\\n"),
        on_revoked=lambda ps: log.write("REVOKE " + ",".join(map(str, ps)) + "\\n"),
    )
    while (batch := c.pull_batch(50, timeout=60.0)) is not None:
        last = {}
        for ev in batch:
            log.write(f"D {ev.partition} {ev.offset}\\n")
            last[ev.partition] = ev
        for p, ev in last.items():
            ev.ack().wait(timeout=60.0)
            log.write(f"A {p} {ev.offset}\\n")
    log.write("END\\n")
    """
)


def spawn(group_file: Path, log: Path):
    return subprocess.Popen([sys.executable, "-c", WORKER, str(group_file), str(log)],
                            stderr=subprocess.PIPE, text=True)


def parse(path: Path):
    delivered, acked = [], defaultdict(lambda: -1)
    for line in path.read_text().splitlines() if path.exists() else []:
        parts = line.split()
        if len(parts) == 3 and parts[0] in ("D", "A"):
            p, o = int(parts[1]), int(parts[2])
            if parts[0] == "D":
                delivered.append((p, o))
            else:
                acked[p] = max(acked[p], o)
    return delivered, acked


def wait_until(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_workers_split_rebalance_on_join_and_on_kill_9(server, tmp_path):
    d = strom.Driver.connect(server.group_file)
    t = d.create_topic("pt", PARTITIONS)
    p = t.producer(lease=None)
    pushed = []

    def wave():
        futs = [p.push({"n": len(pushed) + i}) for i in range(WAVE)]
        pushed.extend(f.wait(timeout=60.0) for f in futs)

    logs = [tmp_path / f"w{k}.log" for k in range(4)]
    seen = lambda: {e for log in logs for e in parse(log)[0]}  # noqa: E731
    def holders():
        return [c for c in d.describe_group("pg")["consumers"] if c["partitions"]]

    wave()
    workers = [spawn(server.group_file, log) for log in logs[:3]]
    wait_until(lambda: len(seen()) >= WAVE, 60, "the first wave read")
    wait_until(lambda: len(holders()) == 3, 30, "three members holding partitions")

    workers.append(spawn(server.group_file, logs[3]))
    wait_until(lambda: len(holders()) == 4, 30, "the fourth member holding partitions")
    sizes = sorted(len(c["partitions"]) for c in holders())
    assert sizes == [1, 1, 2, 2], f"balanced: {sizes}"
    wave()
    wait_until(lambda: len(seen()) >= 2 * WAVE, 60, "the second wave read")

    victim = d.describe_group("pg")["consumers"]
    workers[0].send_signal(signal.SIGKILL)
    workers[0].wait()
    wait_until(lambda: len(d.describe_group("pg")["consumers"]) == 3, 30, "the victim's session to expire")
    wait_until(lambda: sum(len(c["partitions"]) for c in holders()) == PARTITIONS, 30,
               "every partition held again")
    wave()
    p.close()
    for w in workers[1:]:
        w.wait(timeout=120)
        assert w.returncode == 0, w.stderr.read()

    everything = {(e.partition, e.offset) for e in pushed}
    parsed = [parse(log) for log in logs]
    counts = Counter(e for delivered, _ in parsed for e in delivered)
    assert set(counts) == everything, f"{len(everything - set(counts))} events never read"
    # An event read twice: its first reader had not confirmed an ack covering it.
    first_reader = {}
    for k, (delivered, _) in enumerate(parsed):
        for e in delivered:
            first_reader.setdefault(e, set()).add(k)
    for e, n in counts.items():
        if n > 1:
            readers = first_reader[e]
            covered = [k for k in readers if parsed[k][1][e[0]] >= e[1]]
            assert len(covered) <= 1, f"{e} was acked by {covered} and read again"
    dups = sum(n - 1 for n in counts.values())
    assert dups <= 64 * PARTITIONS, f"{dups} duplicates: more than the unacked windows allow"
    for log in logs[1:]:
        text = log.read_text()
        assert "ASSIGN" in text and text.rstrip().endswith("END"), log
    assert victim, "describe listed members before the kill"
