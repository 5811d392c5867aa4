"""Dask provenance into Strom (strom.dask, docs/provenance.md): the scheduler
plugin and the worker plugin publish one record per finished task to a
topic of a real `strom server`; the stream ends when the cluster closes,
and read_topic returns every record."""

from __future__ import annotations

import pickle

import dask
import pytest
from distributed import Client, LocalCluster

import strom
import strom.dask


def inc(x):
    return x + 1


def fail(x):
    raise ValueError(f"bad parameter {x}")


def run(plugin, processes: bool, n: int = 40) -> tuple[list, list, str]:
    """Runs `n` annotated tasks and one that fails; the keys of both."""
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=processes, dashboard_address=None
    ) as cluster, Client(cluster) as client:
        client.register_plugin(plugin)
        with dask.annotate(sweep="a", tag=7):
            futures = client.map(inc, range(n))
        assert client.gather(futures) == [i + 1 for i in range(n)]
        bad = client.submit(fail, 3)
        with pytest.raises(ValueError):
            bad.result()
        return [f.key for f in futures], [bad.key], cluster.scheduler_address


def check(records: list, ok_keys: list, bad_keys: list, source: str) -> None:
    by_key = {r["key"]: r for r in records}
    assert len(records) == len(by_key), "one record per task"
    assert set(by_key) == {str(k) for k in ok_keys + bad_keys}
    for k in ok_keys:
        r = by_key[str(k)]
        assert r["status"] == "ok"
        assert r["group"] == "inc"
        assert r["source"] == source
        assert r["worker"].startswith(("tcp://", "inproc://"))
        assert r["start"] <= r["stop"]
        assert r["actions"]["compute"] >= 0
        assert r["annotations"] == {"sweep": "a", "tag": 7}
        assert r["type"] == "int"
    r = by_key[str(bad_keys[0])]
    assert r["status"] == "error"
    assert "bad parameter 3" in r["exception"]


def test_the_scheduler_plugin_records_every_task_and_the_stream_ends_with_the_cluster(server):
    plugin = strom.dask.ProvenancePlugin(topic="prov", group_file=server.group_file)
    ok, bad, _ = run(plugin, processes=False)
    records = strom.dask.read_topic("prov", group_file=server.group_file, timeout=30)
    check(records, ok, bad, "scheduler")
    d = strom.Driver.connect(server.group_file)
    assert d.describe("prov")["state"]["ended"], "closing the plugin ended the stream"


def test_the_worker_plugin_publishes_from_each_worker_process(server):
    plugin = strom.dask.WorkerProvenancePlugin(topic="wprov", group_file=server.group_file)
    ok, bad, _ = run(plugin, processes=True, n=20)
    records = strom.dask.read_topic("wprov", group_file=server.group_file, timeout=30)
    check(records, ok, bad, "worker")


def test_a_sink_pickles_without_its_connection_and_counts_what_it_could_not_queue(server):
    sink = strom.dask.StromSink("pk", server.group_file)
    sink.publish({"before": "open"})
    assert sink.failed == 1, "a record before open() is counted, not raised"
    sink.open()
    sink.publish({"k": 1})
    copy = pickle.loads(pickle.dumps(sink))
    assert copy._producer is None and copy.topic == "pk"
    copy.open()
    copy.publish({"k": 2})
    copy.close()
    sink.close()
    records = strom.dask.read_topic("pk", group_file=server.group_file, timeout=30)
    assert sorted(r["k"] for r in records) == [1, 2]
    assert (sink.published, copy.published) == (1, 1)
