"""The ADIOS2 SST side of bench/python/pipeline.py: a writer process puts
one array per step, a reader process gets each step's array, the
staging-engine pattern HPC codes use between a simulation and its analysis.

ADIOS2 comes from its PyPI wheel (`bench/peers/adios2/install` puts it in
bench/.work/adios2, outside the project's venv; nothing in `make test`
needs it). That wheel's SST has one data plane, `WAN` (EVPath over
sockets): no RDMA, UCX or MPI plane is built in.

What each side does, as fast as SST honestly goes:

* writer: `BeginStep`, `Put(var, array, Deferred)` of a ring array (never
  modified once sent, so no copy is forced at `Put`), `EndStep`. Its queue
  holds `queue_limit` steps with `QueueFullPolicy=Block` (the bound the
  Strom topic and zmq's high-water mark also have); 0 leaves it unbounded.
* reader: `BeginStep`, `Get(var, buf, Sync)` into one array allocated once
  and reused for every step (SST's best case: its reader never allocates),
  `EndStep`. The writer's `Close` ends the stream.

The rendezvous is a contact file `<endpoint>.sst` in the run's temporary
directory. The writer's `Open` waits for the reader, the reader's `Open`
waits (up to `OpenTimeoutSecs`) for the contact file.
"""

from __future__ import annotations

import sys
from pathlib import Path

WORK = Path(__file__).resolve().parents[1] / ".work" / "adios2"
OPEN_TIMEOUT_S = 120


def bindings():
    """adios2.bindings, from the venv or bench/.work/adios2."""
    try:
        from adios2 import bindings as b  # noqa: F401
    except ImportError:
        if str(WORK) not in sys.path:
            sys.path.insert(0, str(WORK))
        try:
            from adios2 import bindings as b
        except ImportError as e:
            raise RuntimeError("adios2 is not importable: run bench/peers/adios2/install "
                               f"({e})") from e
    return b


def available() -> bool:
    try:
        bindings()
        return True
    except RuntimeError:
        return False


def _io(b, name: str, queue_limit: int):
    adios = b.ADIOS()
    io = adios.DeclareIO(name)
    io.SetEngine("SST")
    io.SetParameters({
        "RendezvousReaderCount": "1",
        "QueueLimit": str(queue_limit),
        "QueueFullPolicy": "Block",
        "OpenTimeoutSecs": str(OPEN_TIMEOUT_S),
    })
    return adios, io


def writer(endpoint: str, queue_limit: int, ready, timeout: float):
    """An open SST writer of uint64 arrays and its `send(array)`; opening
    waits for the reader (after `ready`)."""
    b = bindings()
    adios, io = _io(b, "pipeline-writer", queue_limit)
    if not ready.wait(timeout):
        raise RuntimeError("consumer not ready")
    engine = io.Open(endpoint, b.Mode.Write)
    var = None

    def send(arr):
        nonlocal var
        if var is None:
            n = arr.shape[0]
            var = io.DefineVariable("a", arr, [n], [0], [n], True)
        engine.BeginStep()
        engine.Put(var, arr, b.Mode.Deferred)
        engine.EndStep()

    return (adios, engine), send


def reader(endpoint: str, size: int, queue_limit: int, timeout: float):
    """An open SST reader and its `recv()`: the next step's array (one
    buffer reused for every step), or None at the end of the stream."""
    import numpy as np

    b = bindings()
    adios, io = _io(b, "pipeline-reader", queue_limit)
    engine = io.Open(endpoint, b.Mode.Read)
    buf = np.empty(size // 8, dtype="<u8")

    def recv():
        status = engine.BeginStep(b.StepMode.Read, timeout)
        if status == b.StepStatus.EndOfStream:
            return None
        if status != b.StepStatus.OK:
            raise RuntimeError(f"SST BeginStep: {status}")
        var = io.InquireVariable("a")
        if var is None:
            raise RuntimeError("SST step without the array")
        engine.Get(var, buf, b.Mode.Sync)
        engine.EndStep()
        return buf

    return (adios, engine), recv


def close(handle) -> None:
    _adios, engine = handle
    engine.Close()

