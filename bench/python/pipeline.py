#!/usr/bin/env python3
"""Python pipeline benchmark: one hop of numpy arrays between two processes
on this node, through pyzmq PUSH/PULL and through a Strom server (TCP, and
shared memory).

A producer process sends N numpy arrays of one size, a consumer process
receives them all and checks them; the figure is the time from the first
timed send to the last receive (events/s and MB/s, MB = 10^6 bytes), the
median of a few repetitions. Systems:

* ``zmq-ipc``   pyzmq PUSH/PULL over ``ipc://`` in a temporary directory,
                ``send(arr, copy=False)`` / ``recv(copy=False)`` +
                ``np.frombuffer``: the fastest honest pyzmq hop.
* ``zmq-tcp``   the same over ``tcp://127.0.0.1`` (reference).
* ``strom-tcp`` a ``strom server`` child process listening on TCP only; the
                producer pushes the array as the event's data (zero-copy
                push), the consumer takes ``pull_batch`` and views
                ``ev.data`` (a numpy array over the fetched buffer, no copy).
* ``strom-shm`` the same with a server that also listens on ``shm://auto``
                (the clients pick shm; data parts move with
                ``process_vm_readv``). The server's log is read to confirm
                that every client connection was an shm one.
* ``adios2-sst`` ADIOS2's SST staging engine (its PyPI wheel: the ``WAN``
                socket data plane), one array per step, the reader getting
                each into one reused buffer (bench/python/sst_peer.py). Not
                in the default systems: ``bench/peers/adios2/install`` first.
* ``strom-tcp+many``, ``strom-shm+many``  the same servers, the many-event
                calls: the producer hands ``--many`` arrays to one
                ``push_many(arrays, metadata=b"")``, the consumer takes
                ``pull_many(--many)``. ``--api event,many`` adds these to
                the Strom systems of ``--systems`` (``--api many``: these
                only).

Strom topics are one memory partition bounded at ``--bound`` bytes (64 MiB)
with overflow ``block``: the producer waits when it is full, like a zmq
high-water mark, and the consumer acks the last event of every batch it
pulls (an ack covers every earlier event of its partition), which frees the
room. ``--bound 0`` sizes the partition for the whole run instead (the
server then keeps every event; one ack at the end). Topics are deleted
after each run.

Checks: every array carries a ring index (the producer cycles through
``--ring`` prepared arrays, never modified once sent); the consumer checks
the first and last element of every array against that index, and a sum
over a strided sample of every 32nd array, and the number of events and
bytes. A run that receives fewer events, or a wrong one, is FAILED and the
program exits non-zero.

    python/.venv/bin/python bench/python/pipeline.py                    # every size and system
    python/.venv/bin/python bench/python/pipeline.py --sizes 4MiB --systems zmq-ipc,strom-shm
    python/.venv/bin/python bench/python/pipeline.py --json             # plus one JSON object
    python/.venv/bin/python bench/python/pipeline.py --smoke            # tiny, for tests
    python/.venv/bin/python bench/python/pipeline.py --sizes 1KiB,4KiB,16KiB,64KiB \
        --systems zmq-ipc,strom-tcp,strom-shm --api event,many          # push vs push_many

``$PIPE_PRODUCER`` (JSON, e.g. ``'{"batch_bytes": 262144}'``) passes producer
options to the Strom producer, for experiments with batching.

The ``strom`` binary is ``$STROM_BIN``, else ``target/release/strom`` or
``target/debug/strom`` of this repository; the ``strom`` package must be
importable (``make python-build``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# One BLAS thread: numpy's OpenBLAS pool would otherwise spin on the cores
# the two processes (and the Strom server) need. Inherited by the children.
for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

ROOT = Path(__file__).resolve().parents[2]
SST = "adios2-sst"  # needs adios2 (bench/peers/adios2/install); not in the default systems
SYSTEMS = ("zmq-ipc", "zmq-tcp", "strom-tcp", "strom-shm", SST)
DEFAULT_SYSTEMS = SYSTEMS[:-1]
APIS = ("event", "many")  # Strom: push + pull_batch, or push_many + pull_many
MANY = "+many"  # the suffix of a Strom system run with the many-event calls
DEFAULT_SIZES = ("1KiB", "64KiB", "256KiB", "4MiB")
SUM_EVERY = 32  # events between two sampled-sum checks
SAMPLE = 64  # elements in the sampled sum
RUN_TIMEOUT = 300.0


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def parse_size(s: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*(b|kib|k|mib|m|gib|g)?\s*", s.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {s!r} (e.g. 1KiB, 64KiB, 4MiB, 4096)")
    mult = {None: 1, "b": 1, "k": 1024, "kib": 1024, "m": 1 << 20, "mib": 1 << 20,
            "g": 1 << 30, "gib": 1 << 30}[m.group(2)]
    n = int(m.group(1)) * mult
    if n < 16 or n % 8:
        raise argparse.ArgumentTypeError(f"size {s!r}: at least 16 bytes, a multiple of 8")
    return n


def size_label(n: int) -> str:
    for unit, mult in (("MiB", 1 << 20), ("KiB", 1024)):
        if n >= mult and n % mult == 0:
            return f"{n // mult} {unit}"
    return f"{n} B"


def strom_binary() -> str:
    env = os.environ.get("STROM_BIN")
    if env:
        return env
    for kind in ("release", "debug"):
        b = ROOT / "target" / kind / "strom"
        if b.is_file() and os.access(b, os.X_OK):
            return str(b)
    found = shutil.which("strom")
    if found:
        return found
    raise SystemExit("no strom binary: build it (CARGO_TARGET_DIR=target cargo build --release "
                     "-p strom-cli) or set STROM_BIN")


# --- the arrays and their checks ---------------------------------------------

def stamp(j: int, size: int) -> tuple[int, int]:
    """First and last element of ring array j (uint64)."""
    a = (0x9E3779B97F4A7C15 * (j + 1) + size) & 0xFFFFFFFFFFFFFFFF
    return a, a ^ 0xFFFFFFFFFFFFFFFF


def make_ring(size: int, ring: int):
    """`ring` uint64 arrays of `size` bytes with distinct content: the stamps
    at both ends, a pattern of j in between."""
    import numpy as np

    n = size // 8
    arrs = []
    for j in range(ring):
        a = np.arange(n, dtype="<u8")
        a *= 2654435761
        a += j
        a[0], a[-1] = stamp(j, size)
        arrs.append(a)
    return arrs


def many_default(size: int, bound: int) -> int:
    """Events per push_many / pull_many call: about 4 MiB, 8 to 512 events,
    and at most a quarter of a bounded partition."""
    n = max(8, min(512, (4 << 20) // size))
    if bound:
        n = min(n, max(1, bound // 4 // size))
    return n


def sample_step(size: int) -> int:
    return max(1, (size // 8) // SAMPLE)


class Checker:
    """The consumer's checks: the k-th received array must be ring array k % ring."""

    def __init__(self, size: int, ring: int):
        import numpy as np

        self.n = size // 8
        self.ring = ring
        self.step = sample_step(size)
        self.first = [stamp(j, size)[0] for j in range(ring)]
        self.last = [stamp(j, size)[1] for j in range(ring)]
        self.sums = [int(a[:: self.step].sum(dtype=np.uint64)) for a in make_ring(size, ring)]
        self.count = 0
        self.bytes = 0
        self.bad = 0
        self.first_bad = None

    def check(self, a) -> None:
        j = self.count % self.ring
        ok = a.shape == (self.n,) and int(a[0]) == self.first[j] and int(a[-1]) == self.last[j]
        if ok and self.count % SUM_EVERY == 0:
            ok = int(a[:: self.step].sum(dtype="u8")) == self.sums[j]
        if not ok:
            self.bad += 1
            if self.first_bad is None:
                self.first_bad = self.count
        self.count += 1
        self.bytes += a.nbytes


# --- the two processes ---------------------------------------------------------
#
# Both get: system, endpoint (an ipc/tcp URL for zmq, the group file for
# Strom, SST's rendezvous name), the topic (for SST: its queue limit in
# steps), size, warm-up and timed counts, the ring size, the two
# events (consumer ready, consumer warm) and a queue for their results.
# The producer sends `warm` events, waits until the consumer has them all,
# then takes t0 and sends `events`; the consumer takes t1 at the last one.

def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)  # system-wide: comparable across processes


class Usage(tuple):
    """CPU seconds (user + system) and page faults (minor + major) of this
    process, every thread; differences of two give a window's."""

    def __new__(cls, seconds: float, faults: int):
        return super().__new__(cls, (seconds, faults))

    def __sub__(self, other):
        return Usage(self[0] - other[0], self[1] - other[1])

    def fields(self) -> dict:
        return {"cpu": self[0], "faults": self[1]}


def cpu() -> Usage:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return Usage(r.ru_utime + r.ru_stime, r.ru_minflt + r.ru_majflt)


def producer_main(system, endpoint, topic, size, warm, events, ring, ready, warmed, out, many=0):
    try:
        arrs = make_ring(size, ring)
        if system.startswith("zmq"):
            import zmq

            ctx = zmq.Context()
            s = ctx.socket(zmq.PUSH)
            s.connect(endpoint)
            if not ready.wait(RUN_TIMEOUT):
                raise RuntimeError("consumer not ready")
            for k in range(warm):
                s.send(arrs[k % ring], copy=False)
            if not warmed.wait(RUN_TIMEOUT):
                raise RuntimeError("consumer did not receive the warm-up events")
            c0, t0 = cpu(), now()
            for k in range(warm, warm + events):
                s.send(arrs[k % ring], copy=False)
            t_sent = now()
            s.close(linger=-1)  # returns once everything queued went out
            ctx.term()
        elif system == SST:
            import sst_peer

            handle, send = sst_peer.writer(endpoint, topic, ready, RUN_TIMEOUT)
            for k in range(warm):
                send(arrs[k % ring])
            if not warmed.wait(RUN_TIMEOUT):
                raise RuntimeError("consumer did not receive the warm-up events")
            c0, t0 = cpu(), now()
            for k in range(warm, warm + events):
                send(arrs[k % ring])
            t_sent = now()
            sst_peer.close(handle)  # ends the stream
        else:
            import strom

            d = strom.Driver.connect(endpoint)
            p = d.open_topic(topic).producer(**json.loads(os.environ.get("PIPE_PRODUCER", "{}")))
            if not ready.wait(RUN_TIMEOUT):
                raise RuntimeError("consumer not ready")
            if many:
                # arrays k..k+n-1 are cycle[k % ring : k % ring + n]
                cycle = [arrs[k % ring] for k in range(ring + many)]

                def send(lo, hi):
                    for k in range(lo, hi, many):
                        j = k % ring
                        p.push_many(cycle[j:j + min(many, hi - k)], metadata=b"")
            else:
                def send(lo, hi):
                    push = p.push
                    for k in range(lo, hi):
                        push(b"", arrs[k % ring])  # zero-copy: the ring is never modified
            send(0, warm)
            p.flush()
            if not warmed.wait(RUN_TIMEOUT):
                raise RuntimeError("consumer did not receive the warm-up events")
            c0, t0 = cpu(), now()
            send(warm, warm + events)
            t_sent = now()
            p.close()  # flushes, then ends the stream
            del p, d
        out.put(("producer", {"t0": t0, "t_sent": t_sent, **(cpu() - c0).fields()}))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        out.put(("producer", {"error": f"{type(e).__name__}: {e}"}))


def consumer_main(system, endpoint, topic, size, warm, events, ring, ready, warmed, out,
                  many=0, ack_every_batch=False):
    try:
        import numpy as np

        chk = Checker(size, ring)
        total = warm + events
        t1 = c1 = None
        c0 = cpu()  # no warm-up: from the start
        if system.startswith("zmq"):
            import zmq

            ctx = zmq.Context()
            s = ctx.socket(zmq.PULL)
            s.bind(endpoint)
            ready.set()
            if not warm:
                warmed.set()
            recv, frombuffer, check = s.recv, np.frombuffer, chk.check
            for k in range(total):
                f = recv(copy=False)
                check(frombuffer(f, dtype="<u8"))
                if k + 1 == warm:
                    c0 = cpu()
                    warmed.set()
            t1, c1 = now(), cpu()
            s.close()
            ctx.term()
        elif system == SST:
            import sst_peer

            ready.set()  # before Open: the writer's Open waits for this reader
            handle, recv = sst_peer.reader(endpoint, size, topic, RUN_TIMEOUT)
            if not warm:
                warmed.set()
            check = chk.check
            while (a := recv()) is not None:
                check(a)
                if chk.count == warm:
                    c0 = cpu()
                    warmed.set()
                if chk.count == total:
                    t1, c1 = now(), cpu()
            sst_peer.close(handle)
        else:
            import strom

            d = strom.Driver.connect(endpoint)
            c = d.open_topic(topic).consumer("pipeline", start="beginning")
            ready.set()
            if not warm:
                warmed.set()
            check, last = chk.check, None
            while True:
                if many:
                    # never more than the warm-up (the producer waits for it), nor the run
                    left = (warm if chk.count < warm else total) - chk.count
                    batch = c.pull_many(min(many, left) or many, timeout=RUN_TIMEOUT)
                else:
                    batch = c.pull_batch(512, timeout=RUN_TIMEOUT)
                if batch is None:  # end of stream: the producer closed
                    break
                if not batch:
                    raise RuntimeError(f"no event for {RUN_TIMEOUT:.0f} s after {chk.count}")
                for ev in batch:
                    check(ev.data)  # a numpy array over the fetched bytes
                    if chk.count == warm:
                        c0 = cpu()
                        warmed.set()
                    if chk.count == total:
                        t1, c1 = now(), cpu()
                last = batch[-1]
                if ack_every_batch:  # frees room in a bounded (block) partition
                    last.ack()
            if last is not None:
                last.ack().wait(60)  # one ack covers the partition up to here
            c.close()
            del c, d
        if chk.count < warm:
            warmed.set()
        usage = {"cpu": None, "faults": None} if c1 is None else (c1 - c0).fields()
        out.put(("consumer", {"t1": t1, **usage, "received": chk.count, "bytes": chk.bytes,
                              "bad": chk.bad, "first_bad": chk.first_bad}))
    except BaseException as e:  # noqa: BLE001
        warmed.set()
        out.put(("consumer", {"error": f"{type(e).__name__}: {e}"}))


# --- Strom servers ---------------------------------------------------------------

class StromServer:
    """A `strom server` child process (TCP only, or TCP + shm://auto), with
    strom_net debug logging so the shm connections can be counted."""

    def __init__(self, binary: str, directory: Path, shm: bool):
        self.dir = directory
        self.shm = shm
        directory.mkdir(parents=True, exist_ok=True)
        self.group = directory / "group.json"
        self.log_path = directory / "server.log"
        args = [binary, "server", "--data-dir", str(directory / "data"), "--listen", "127.0.0.1:0",
                "--group-file", str(self.group)]
        if shm:
            args += ["--also-listen", "shm://auto"]
        elif "--no-shm" in subprocess.run([binary, "server", "--help"], capture_output=True,
                                          text=True).stdout:
            args += ["--no-shm"]  # servers serve shm by default since --no-shm exists
        env = {**os.environ, "STROM_LOG": "strom_net=debug,info"}
        env.pop("STROM_TRANSPORT", None)
        self.logf = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self.logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env)
        want = 2 if shm else 1
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"strom server exited {self.proc.returncode}: "
                                   f"{self.log_path.read_text()[-2000:]}")
            try:
                g = json.loads(self.group.read_text())
                addrs = [a for m in g.get("members", []) for a in (m.get("addrs") or [m.get("addr")])]
                if len(addrs) >= want:
                    self.addrs = addrs
                    break
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("strom server did not write its group file within 30 s")
            time.sleep(0.05)

    def shm_connections(self) -> tuple[int, int]:
        """(shm connections opened, of which one-copy both ways) so far."""
        text = self.log_path.read_text(errors="replace")
        lines = [l for l in text.splitlines() if "shm connection open" in l]
        return len(lines), sum(1 for l in lines if "we_pull=true peer_pulls=true" in l)

    def usage(self) -> Usage:
        """CPU seconds (user + system) and page faults of the server so far."""
        f = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return Usage((int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK"), int(f[7]) + int(f[9]))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()


# --- one run -------------------------------------------------------------------

def one_run(system, size, events, warm, ring, ctx, tmp: Path, servers, admin, bound=None,
            many=0) -> dict:
    run = {"system": system, "size": size, "events": events, "warmup": warm}
    if system.endswith(MANY):
        system = system[: -len(MANY)]
        run["many"] = many
    else:
        many = 0
    topic = carry = None  # carry: the Strom topic, or SST's queue limit in steps
    if system == SST:
        endpoint = f"{tmp}/sst{time.monotonic_ns() % 10**9}"  # the contact file: <endpoint>.sst
        carry = max(1, bound // size) if bound else 0
        run["queue_limit"] = carry
    elif system == "zmq-ipc":
        endpoint = f"ipc://{tmp}/z{time.monotonic_ns() % 10**9}.sock"  # sun_path: 107 bytes
    elif system == "zmq-tcp":
        import socket

        with socket.socket() as so:  # a free port; the consumer binds it next
            so.bind(("127.0.0.1", 0))
            endpoint = f"tcp://127.0.0.1:{so.getsockname()[1]}"
    else:
        srv = servers[system]
        endpoint = str(srv.group)
        topic = f"pipe-{size}-{time.monotonic_ns()}"
        if bound:  # a bounded buffer with backpressure; the consumer acks every batch
            admin[system].create_topic(topic, 1, type="memory", retention_bytes=bound,
                                       overflow="block")
            run["bound"] = bound
        else:  # every event of the run fits; one ack at the end
            need = (warm + events) * (size + 1024)
            admin[system].create_topic(topic, 1, type="memory",
                                       retention_bytes=need + need // 4 + (64 << 20),
                                       overflow="drop-oldest")
        shm_before = srv.shm_connections()
        server0 = srv.usage()
        carry = topic
    ready, warmed, out = ctx.Event(), ctx.Event(), ctx.Queue()
    args = (system, endpoint, carry, size, warm, events, ring, ready, warmed, out, many)
    cons = ctx.Process(target=consumer_main, args=(*args, bool(bound)), name="consumer")
    prod = ctx.Process(target=producer_main, args=args, name="producer")
    child_env = {}
    if system == "strom-tcp":
        child_env["STROM_TRANSPORT"] = "tcp"  # belt and braces: the server has TCP only anyway
    saved = {k: os.environ.get(k) for k in ("STROM_TRANSPORT",)}
    os.environ.pop("STROM_TRANSPORT", None)
    os.environ.update(child_env)
    try:
        cons.start()
        prod.start()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    got = {}
    deadline = time.monotonic() + RUN_TIMEOUT + 60
    while len(got) < 2 and time.monotonic() < deadline:
        try:
            who, v = out.get(timeout=1.0)
            got[who] = v
        except Exception:  # queue.Empty
            if not cons.is_alive() and not prod.is_alive() and out.empty():
                break
    for p in (prod, cons):
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join()
    errors = [f"{w}: {v['error']}" for w, v in got.items() if "error" in v]
    errors += [f"{w} died (exit {p.exitcode}) without a result" for w, p in
               (("producer", prod), ("consumer", cons)) if w not in got]
    c, pr = got.get("consumer", {}), got.get("producer", {})
    total = warm + events
    if not errors:
        if c["received"] != total:
            errors.append(f"received {c['received']} of {total} events")
        if c["bad"]:
            errors.append(f"{c['bad']} events failed the check (first: #{c['first_bad']})")
        if c["bytes"] != total * size:
            errors.append(f"received {c['bytes']} bytes, not {total * size}")
    if topic:
        srv = servers[system]
        used = srv.usage() - server0  # the whole run, warm-up included
        run["server_cpu_s"], run["server_faults"] = used
        n, onecopy = (a - b for a, b in zip(srv.shm_connections(), shm_before))
        run["shm_connections"], run["shm_one_copy"] = n, onecopy
        if system == "strom-shm" and n < 2:
            errors.append(f"only {n} shm connection(s) opened for the producer and consumer: "
                          "not the shm path")
        if system == "strom-tcp" and n:
            errors.append(f"{n} shm connection(s) on the TCP-only server")
        try:
            admin[system].delete_topic(topic)
        except Exception as e:  # noqa: BLE001
            log(f"  (could not delete topic {topic}: {e})")
    if errors:
        run.update(failed=True, error="; ".join(errors))
        return run
    dt = c["t1"] - pr["t0"]
    run.update(received=c["received"], seconds=dt, events_per_s=events / dt,
               mb_per_s=events * size / dt / 1e6, send_seconds=pr["t_sent"] - pr["t0"],
               producer_cpu_s=pr["cpu"], consumer_cpu_s=c["cpu"])
    # CPU microseconds per event: producer and consumer over the timed events,
    # the server over the whole run (warm-up and topic setup included)
    run["cpu_us_per_event"] = {
        "producer": pr["cpu"] / events * 1e6, "consumer": c["cpu"] / events * 1e6,
        **({"server": run["server_cpu_s"] / (warm + events) * 1e6} if topic else {})}
    # page faults per GB moved (a fresh page costs one fault per 4 KiB: 244,141 per GB)
    gb = events * size / 1e9
    run["faults_per_gb"] = {
        "producer": pr["faults"] / gb, "consumer": c["faults"] / gb,
        **({"server": run["server_faults"] / ((warm + events) * size / 1e9)} if topic else {})}
    return run


def default_events(size: int, budget: int) -> int:
    return max(64, min(50_000, budget // size))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=",".join(DEFAULT_SIZES),
                    help="comma-separated array sizes in bytes (1KiB, 64KiB, 4MiB, ...); "
                         "default %(default)s")
    ap.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                    help=f"comma-separated, of {', '.join(SYSTEMS)} (default: all but {SST}, "
                         "which needs bench/peers/adios2/install)")
    ap.add_argument("--events", type=int, default=None,
                    help="timed events per run (default: 1 GiB / size, within 64..50,000)")
    ap.add_argument("--budget", type=parse_size, default=1 << 30,
                    help="bytes per run when --events is not given (default 1GiB)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed events first (default: events/20, within 4..500)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions (median shown); default 3")
    ap.add_argument("--bound", type=lambda v: 0 if v.strip() == "0" else parse_size(v),
                    default=64 << 20,
                    help="Strom: the memory partition holds this many bytes, overflow `block` "
                         "(backpressure, like a zmq high-water mark; the consumer acks every "
                         "batch); default 64MiB; 0: a partition sized for the whole run, one "
                         "ack at the end")
    ap.add_argument("--api", default="event",
                    help="Strom calls, comma-separated: event (push + pull_batch, the systems' "
                         "own names) and/or many (push_many + pull_many, as <system>+many); "
                         "default %(default)s")
    ap.add_argument("--many", type=int, default=None,
                    help="events per push_many / pull_many call (default: about 4 MiB, "
                         "8 to 512, at most a quarter of --bound)")
    ap.add_argument("--ring", type=int, default=8, help="distinct arrays the producer cycles through")
    ap.add_argument("--json", action="store_true", help="also print one JSON object (last line)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny run for tests: 1 KiB and 64 KiB, 200 events, 1 repetition")
    args = ap.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    apis = [a.strip() for a in args.api.split(",") if a.strip()]
    for a in apis:
        if a not in APIS:
            ap.error(f"unknown api {a!r} (of {', '.join(APIS)})")
    known = SYSTEMS + tuple(s + MANY for s in SYSTEMS if s.startswith("strom"))
    systems = []
    for s in (s.strip() for s in args.systems.split(",") if s.strip()):
        if s not in known:
            ap.error(f"unknown system {s!r} (of {', '.join(known)})")
        if s.startswith("strom") and not s.endswith(MANY):
            variants = [s if a == "event" else s + MANY for a in apis]
        else:
            variants = [s]
        systems += [v for v in variants if v not in systems]
    if args.many is not None and args.many < 1:
        ap.error("--many must be at least 1")
    if args.smoke:
        if args.sizes == ",".join(DEFAULT_SIZES):
            sizes = [1024, 65536]
        args.events, args.reps = args.events or 200, 1
        args.warmup = 10 if args.warmup is None else args.warmup

    unavailable = {}
    if any(s.startswith("zmq") for s in systems):
        try:
            import zmq  # noqa: F401
        except ImportError as e:
            for s in systems:
                if s.startswith("zmq"):
                    unavailable[s] = f"pyzmq not installed ({e}); make python-setup installs it"
    if any(s.startswith("strom") for s in systems):
        try:
            import strom  # noqa: F401
        except ImportError as e:
            for s in systems:
                if s.startswith("strom"):
                    unavailable[s] = f"the strom package is not importable ({e}): make python-build"
    if SST in systems:
        import sst_peer

        if not sst_peer.available():
            unavailable[SST] = "adios2 is not importable: bench/peers/adios2/install"
    for s, why in unavailable.items():
        log(f"{s} left out: {why}")
    systems = [s for s in systems if s not in unavailable]
    import numpy as np  # noqa: F401  (fail early when numpy is missing)

    ctx = mp.get_context("spawn")  # fresh processes: no inherited Strom driver or zmq context
    results = []
    binary = None
    servers, admin = {}, {}
    tmp = Path(tempfile.mkdtemp(prefix="strom-pipeline-"))
    try:
        if any(s.startswith("strom") for s in systems):
            import strom

            binary = strom_binary()
            log(f"strom binary: {binary}")
            for s in dict.fromkeys(s.removesuffix(MANY) for s in systems):
                if s.startswith("strom"):
                    servers[s] = StromServer(binary, tmp / s, shm=(s == "strom-shm"))
                    log(f"{s} server: {', '.join(servers[s].addrs)}")
                    admin[s] = strom.Driver.connect(str(servers[s].group))
        for rep in range(args.reps):
            for size in sizes:
                events = args.events or default_events(size, args.budget)
                warm = args.warmup if args.warmup is not None else max(4, min(500, events // 20))
                many = args.many or many_default(size, args.bound)
                for system in systems:  # the systems take turns within a repetition
                    r = one_run(system, size, events, warm, args.ring, ctx, tmp, servers, admin,
                                args.bound, many)
                    r["rep"] = rep
                    results.append(r)
                    if r.get("failed"):
                        log(f"  rep {rep + 1} {size_label(size):>8} {system:<10} FAILED: {r['error']}")
                    else:
                        log(f"  rep {rep + 1} {size_label(size):>8} {system:<10} "
                            f"{r['events_per_s']:>12,.0f} ev/s {r['mb_per_s']:>10,.1f} MB/s")
    finally:
        admin.clear()
        for s in servers.values():
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    # medians per (size, system)
    table = []
    for size in sizes:
        for system in systems:
            runs = [r for r in results if r["size"] == size and r["system"] == system]
            ok = [r for r in runs if not r.get("failed")]
            row = {"size": size, "label": size_label(size), "system": system,
                   "events": runs[0]["events"] if runs else 0, "reps": len(runs),
                   "failed": len(runs) - len(ok),
                   "errors": sorted({r["error"] for r in runs if r.get("failed")})}
            if ok:
                row["events_per_s"] = statistics.median(r["events_per_s"] for r in ok)
                row["mb_per_s"] = statistics.median(r["mb_per_s"] for r in ok)
                row["mb_per_s_min"] = min(r["mb_per_s"] for r in ok)
                row["mb_per_s_max"] = max(r["mb_per_s"] for r in ok)
                row["faults_per_gb"] = statistics.median(
                    sum(r["faults_per_gb"].values()) for r in ok)
            table.append(row)

    def med(size, system):
        r = next((t for t in table if t["size"] == size and t["system"] == system), None)
        return r.get("mb_per_s") if r and not r["failed"] else None

    print("faults/GB: page faults of producer, consumer and server per GB moved (fresh "
          "memory costs one per 4 KiB page: 244,141 per GB)")
    print(f"Python pipeline, one hop between two processes; median of {args.reps} "
          f"repetition(s); MB/s = 10^6 bytes/s; Strom: memory partition, "
          + (f"{args.bound / 1048576:g} MiB, overflow block" if args.bound else
             "sized for the run"))
    print(f"{'size':>8}  {'system':<10} {'events':>7} {'events/s':>12} {'MB/s':>10}   "
          f"{'min..max MB/s':<19} {'faults/GB':>9}  status")
    for row in table:
        if "mb_per_s" in row:
            rng = f"{row['mb_per_s_min']:,.0f}..{row['mb_per_s_max']:,.0f}"
            st = "ok" if not row["failed"] else f"FAILED {row['failed']}/{row['reps']}"
            print(f"{row['label']:>8}  {row['system']:<10} {row['events']:>7} "
                  f"{row['events_per_s']:>12,.0f} {row['mb_per_s']:>10,.1f}   {rng:<19} "
                  f"{row['faults_per_gb']:>9,.0f}  {st}")
        else:
            print(f"{row['label']:>8}  {row['system']:<10} {row['events']:>7} {'':>12} {'':>10}   "
                  f"{'':<19} {'':>9}  FAILED: {'; '.join(row['errors'])[:200]}")
    ratios = {}  # against zmq-ipc, and against SST where it ran
    for peer in ("zmq-ipc", SST):
        for size in sizes:
            base = med(size, peer)
            for system in [s for s in systems if s.startswith("strom")]:
                v = med(size, system)
                if base and v:
                    ratios.setdefault(peer, {}).setdefault(system, {})[size] = v / base
    for peer, by_system in ratios.items():
        for system, per in by_system.items():
            print(f"{system} / {peer} (MB/s): " + ", ".join(
                f"{size_label(s)} {r:.2f}{'' if r >= 1 else ' (<1)'}" for s, r in per.items()))
    nfail = sum(1 for r in results if r.get("failed"))
    if args.json:
        print(json.dumps({"benchmark": "python-pipeline", "reps": args.reps, "strom_bin": binary,
                          "strom_partition": {"type": "memory", "retention_bytes": args.bound or
                                              "sized for the run",
                                              "overflow": "block" if args.bound else "drop-oldest"},
                          "unavailable": unavailable, "sizes": sizes, "systems": systems,
                          "table": table, "ratios_vs_zmq_ipc": ratios.get("zmq-ipc", {}),
                          "ratios_vs_adios2_sst": ratios.get(SST, {}), "runs": results,
                          "failed_runs": nfail}))
    return 1 if nfail else 0


if __name__ == "__main__":
    sys.exit(main())
