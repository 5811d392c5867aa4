"""An MPI job for test_mpi.py: run under ``mpirun -n 4``. Prints one line
``CHECKS OK <rank>`` per rank when every check held; raises otherwise."""

import sys

import numpy as np
from mpi4py import MPI

from strom.mpi import BOTH, CONSUMER, NONE, PRODUCER, Channel, ChannelError

N = 40
comm = MPI.COMM_WORLD
rank = comm.rank
assert comm.size == 4, "run with 4 ranks"


def share() -> None:
    """2 producers, 2 consumers, 2 servers: every array reaches one consumer, in order."""
    role = PRODUCER if rank < 2 else CONSUMER
    seen = []
    with Channel(comm, role, "share", servers_per_node=2) as ch:
        assert len(ch.driver.members()) == 2, ch.driver.members()
        if role == PRODUCER:
            for i in range(N):
                ch.push(np.full((3, 4), rank * 1000.0 + i), {"p": rank, "i": i})
            ch.end()
        else:
            last = {0: -1, 1: -1}
            for ev in ch:
                a, m = ev.data, ev.metadata
                assert isinstance(a, np.ndarray) and a.dtype == np.float64 and a.shape == (3, 4), (type(a), ev.descriptor)
                assert (a == m["p"] * 1000.0 + m["i"]).all()
                assert m["i"] > last[m["p"]], "out of order"
                last[m["p"]] = m["i"]
                seen.append((m["p"], m["i"]))
                ev.ack()
    everything = sorted(sum(comm.allgather(seen), []))
    assert everything == [(p, i) for p in range(2) for i in range(N)], everything


def broadcast_and_operate() -> None:
    """Rank 0 produces; ranks 1-3 each read everything, through operate()."""
    role = BOTH if rank == 0 else CONSUMER
    got: list[int] = []
    with Channel(comm, role, "bcast", distribution="broadcast", partitions=2) as ch:
        if rank == 0:
            for i in range(N):
                ch.push(np.arange(i, i + 5, dtype=np.int32))
            ch.end()
        calls = []
        ch.operate(lambda ev: got.append(int(ev.data[0])), lambda: calls.append("start"), lambda: calls.append("end"))
        assert calls == ["start", "end"], calls
    assert sorted(got) == list(range(N)), (rank, got)


def errors() -> None:
    """A bad role on rank 3 fails the open on every rank, naming rank 3."""
    try:
        Channel(comm, 7 if rank == 3 else NONE, "bad")
    except ChannelError as e:
        assert e.rank == 3 and "role 7" in str(e), str(e)
    else:
        raise AssertionError("the open did not fail")


share()
broadcast_and_operate()
errors()
# One write() for the whole line: the ranks share mpirun's stdout, and
# print() writes the text and its newline separately, so two ranks' lines
# could interleave ("CHECKS OK 0CHECKS OK 2").
sys.stdout.write(f"CHECKS OK {rank}\n")
sys.stdout.flush()
