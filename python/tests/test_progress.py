"""Background progress: a producer process pushes a batch and then spends
2 s in a pure-Python busy loop; a consumer in another process receives every
event during that loop, not after it, because batching and network I/O run
on Strom's own threads."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

N = 2000

PRODUCER = textwrap.dedent(
    """
    import json, sys, time, strom
    d = strom.Driver.connect(sys.argv[1])
    p = d.open_topic("progress").producer()
    payload = b"x" * 1024
    futs = [p.push({"i": i}, payload) for i in range(%d)]
    pushed = time.time()
    x = 0
    while time.time() < pushed + 2.0:   # pure Python, holds the GIL
        x += 1
    busy_end = time.time()
    done_during_loop = sum(f.done() for f in futs)
    print(json.dumps({"pushed": pushed, "busy_end": busy_end, "done": done_during_loop}), flush=True)
    p.close()
    """
    % N
)

CONSUMER = textwrap.dedent(
    """
    import json, sys, time, strom
    d = strom.Driver.connect(sys.argv[1])
    c = d.open_topic("progress").consumer("watcher")
    print("ready", flush=True)
    times = [time.time() for ev in c]
    print(json.dumps(times), flush=True)
    """
)


def test_events_flow_while_the_producer_busy_loops_in_python(server):
    import strom

    strom.Driver.connect(server.group_file).create_topic("progress", 1, type="memory")
    consumer = subprocess.Popen(
        [sys.executable, "-c", CONSUMER, str(server.group_file)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert consumer.stdout.readline().strip() == "ready"
        producer = subprocess.run(
            [sys.executable, "-c", PRODUCER, str(server.group_file)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert producer.returncode == 0, producer.stderr
        info = json.loads(producer.stdout)
        out, _ = consumer.communicate(timeout=120)
    finally:
        consumer.kill()
    received = json.loads(out.splitlines()[-1])
    assert len(received) == N, "every event arrived"
    late = [t for t in received if t > info["busy_end"]]
    assert not late, (
        f"{len(late)} of {N} events arrived after the producer's busy loop ended "
        f"(last {max(received) - info['busy_end']:.3f}s late)"
    )
    assert info["done"] == N, "every push future resolved while Python was busy"
