"""The client conformance suite, from Python: mirrors
crates/strom-client/tests/conformance.rs. Each test runs against memory and
file partitions, each with its own embedded server."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

import strom
from conftest import drain, take


def push_n(p, n, data=lambda i: None):
    futs = [p.push({"i": i}, data(i)) for i in range(n)]
    p.flush()
    return [f.wait(timeout=30) for f in futs]


def offsets(events):
    return [e.offset for e in events]


# ---------------------------------------------------------------- ordering


def test_one_producer_keeps_push_order_within_a_partition(driver, ptype):
    t = driver.create_topic("order1", 1, type=ptype)
    p = t.producer()
    ids = []
    for burst in range(100):
        futs = [p.push({"i": burst * 4 + j}) for j in range(4)]
        p.flush()
        ids += [f.wait().offset for f in futs]
    p.close()
    assert ids == list(range(400)), "offsets in push order"
    events = drain(t.consumer("c"))
    assert [e.metadata["i"] for e in events] == list(range(400)), "events in push order"


def test_each_producer_keeps_its_order_and_offsets_are_dense(driver, ptype):
    n = 300
    t = driver.create_topic("order", 1, type=ptype)
    failures = []
    # Registered up front: a stream whose producers have all closed ends,
    # and an ended topic accepts no new producer.
    producers = [t.producer() for _ in range(3)]

    def produce(k):
        try:
            p = producers[k]
            futs = [p.push({"producer": k, "seq": i}, bytes([k]) * (i % 5)) for i in range(n)]
            p.close()
            ids = [f.wait().offset for f in futs]
            assert ids == sorted(ids), f"producer {k}'s offsets are not increasing"
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not failures, failures
    events = drain(t.consumer("c"))
    assert offsets(events) == list(range(3 * n)), "offsets are not dense from 0"
    last = {}
    seen = [0, 0, 0]
    for e in events:
        k, seq = e.metadata["producer"], e.metadata["seq"]
        assert seq > last.get(k, -1), f"producer {k}: seq {seq} arrived after {last.get(k)}"
        last[k] = seq
        assert bytes(e.data) == bytes([k]) * (seq % 5)
        seen[k] += 1
    assert seen == [n] * 3


# ---------------------------------------------------- selectors and brokers

DATA_LEN = 4096


@pytest.fixture
def data_topic(driver, ptype):
    t = driver.create_topic("data", 1, type=ptype)
    originals = [os.urandom(DATA_LEN) for _ in range(4)]
    p = t.producer()
    push_n(p, 4, lambda i: originals[i])
    p.close()
    return t, originals


def read_with(t, name, selector, n=4):
    events = drain(t.consumer(name, data_selector=selector))
    assert len(events) == n, f"selector {name}: event count"
    for e in events:
        assert e.data_size == DATA_LEN
        assert e.fetched_size == len(bytes(e.data))
    return events


def test_every_data_selector_fetches_exactly_the_selected_bytes(data_topic):
    t, orig = data_topic
    for e in read_with(t, "none", strom.select.none()):
        assert e.fetched_size == 0 and bytes(e.data) == b""
    for e in read_with(t, "all", strom.select.all()):
        assert bytes(e.data) == orig[e.metadata["i"]]
    for e in read_with(t, "range", strom.select.range(100, 50)):
        assert bytes(e.data) == orig[e.metadata["i"]][100:150]
    for e in read_with(t, "strided", strom.select.strided(3, 10, 100, 7)):
        o = orig[e.metadata["i"]]
        assert bytes(e.data) == b"".join(o[3 + k * 100 : 13 + k * 100] for k in range(7))
    for e in read_with(t, "ranges", strom.select.ranges([(4000, 96), (0, 10)])):
        o = orig[e.metadata["i"]]
        assert bytes(e.data) == o[4000:] + o[:10], "ranges come in the given order"
    for e in read_with(t, "where", strom.select.where("i", ">=", 2)):
        i = e.metadata["i"]
        assert bytes(e.data) == (orig[i] if i >= 2 else b"")
    for e in read_with(t, "where-then", strom.select.where("i", "==", 1, strom.select.range(0, 8))):
        i = e.metadata["i"]
        assert bytes(e.data) == (orig[i][:8] if i == 1 else b"")

    calls = []

    def python_selector(meta, info):
        calls.append((meta["i"], info["size"]))
        return (meta["i"], 16)

    for e in read_with(t, "callable", python_selector):
        i = e.metadata["i"]
        assert bytes(e.data) == orig[i][i : i + 16]
    assert calls == [(i, DATA_LEN) for i in range(4)]


def test_custom_broker_receives_the_bytes_across_its_buffers_in_order(data_topic):
    t, orig = data_topic
    calls = []

    def broker(meta, length):
        calls.append((meta["i"], length))
        return [bytearray(10), bytearray(length - 10)]

    events = drain(t.consumer("b", data_broker=broker))
    assert len(events) == 4
    for e in events:
        o = orig[e.metadata["i"]]
        first, second = e.data
        assert isinstance(first, bytearray), "the broker's own buffers come back"
        assert bytes(first) == o[:10] and bytes(second) == o[10:]
    assert calls == [(i, DATA_LEN) for i in range(4)]


def test_failing_python_selector_raises_with_its_exception_as_cause(data_topic):
    t, _ = data_topic

    def bad(meta, info):
        raise KeyError("no such field")

    c = t.consumer("bad", data_selector=bad)
    with pytest.raises(strom.DataError) as err:
        c.pull(timeout=30)
    assert err.value.code == 601 and err.value.code_name == "DATA_SELECTOR"
    assert isinstance(err.value.__cause__, KeyError)


# ------------------------------------------------------------- validators

SCHEMA = {
    "type": "object",
    "required": ["step"],
    "properties": {"step": {"type": "integer", "minimum": 0}},
}


def test_json_schema_validator_rejects_bad_metadata_and_names_the_rule(driver, ptype):
    t = driver.create_topic("v", 1, type=ptype, validator="json-schema", schema=SCHEMA)
    p = t.producer()
    p.push({"step": 1}).wait()
    for meta, rule in [({"x": 1}, "required"), ({"step": "a"}, "type"), ({"step": -1}, "minimum")]:
        with pytest.raises(strom.InvalidMetadata) as err:
            p.push(meta)
        assert err.value.code == 400 and err.value.code_name == "INVALID_METADATA"
        assert rule in str(err.value), f"{meta}: {err.value}"
        assert isinstance(err.value, strom.StromError) and isinstance(err.value, ValueError)
    p.push({"step": 2})
    p.push(json.dumps({"step": 7}))
    p.close()
    events = drain(t.consumer("c"))
    assert [e.metadata["step"] for e in events] == [1, 2, 7], "only valid events were stored"


def test_json_validator_rejects_text_that_is_not_json(driver, ptype):
    t = driver.create_topic("j", 1, type=ptype, validator="json")
    p = t.producer()
    for bad in ["{", "not json", b"\xff"]:
        with pytest.raises(strom.InvalidMetadata) as err:
            p.push(bad)
        assert err.value.code == 400
    assert p.push('{"ok": true}').wait().offset == 0, "rejected events took no offsets"
    p.close()
    (e,) = drain(t.consumer("c"))
    assert e.raw_metadata == b'{"ok": true}'


# ----------------------------------------------------------- acks and seek


def test_acks_persist_across_a_consumer_restart_per_name(driver, ptype):
    k = 5
    t = driver.create_topic("acks", 1, type=ptype)
    p = t.producer()
    push_n(p, 10)
    first_consumer = t.consumer("a")
    first = take(first_consumer, k)
    assert offsets(first) == list(range(k))
    first[-1].ack().wait(timeout=30)
    first_consumer.close()
    assert offsets(take(t.consumer("a"), 3)) == [5, 6, 7], "resumes after the last ack"
    assert offsets(take(t.consumer("other"), 3)) == [0, 1, 2], "acks are per name"
    assert driver.consumer_offsets("acks", 0) == {"a": 5}


def test_an_idempotent_producer_stores_each_event_once_in_order(driver, ptype):
    t = driver.create_topic("once", 2, type=ptype)
    p = t.producer(idempotent=True, acks="leader")
    ids = [p.push(f'{{"i": {i}}}', bytes([i]) * 8, partition=i % 2) for i in range(40)]
    p.flush()
    got = [f.wait() for f in ids]
    p.close()
    for part in (0, 1):
        assert [o for (q, o) in got if q == part] == list(range(20))
    events = drain(t.consumer("c"))
    assert sorted(json.loads(e.raw_metadata)["i"] for e in events) == list(range(40))
    with pytest.raises(TypeError):
        t.producer(idempotent="yes")


@pytest.fixture
def seek_topic(driver, ptype):
    t = driver.create_topic("seek", 1, type=ptype)
    p = t.producer()
    push_n(p, 10)
    return t, p


def test_seek_to_beginning_replays_every_event(seek_topic):
    t, _ = seek_topic
    c = t.consumer("c")
    assert offsets(take(c, 6)) == list(range(6))
    c.seek("beginning")
    assert offsets(take(c, 10)) == list(range(10))


def test_seek_to_end_receives_only_newer_events(seek_topic):
    t, p = seek_topic
    c = t.consumer("c")
    assert c.pull(timeout=30).offset == 0
    c.seek("end")
    assert p.push({"i": 10}).wait().offset == 10
    assert c.pull(timeout=30).offset == 10


def test_seek_to_offset_starts_at_that_offset(seek_topic):
    t, p = seek_topic
    p.close()
    c = t.consumer("c", start=4)
    assert offsets(drain(c)) == list(range(4, 10))
    c.seek(8)
    assert offsets(drain(c)) == [8, 9]
    c.seek(("offset", 3))
    assert offsets(drain(c)) == list(range(3, 10))


def test_seek_to_timestamp_starts_at_the_first_event_not_older(driver, ptype):
    t = driver.create_topic("ts", 1, type=ptype)
    p = t.producer()
    push_n(p, 5)
    time.sleep(0.05)
    ts = int(time.time() * 1e6)
    time.sleep(0.05)
    push_n(p, 5)
    p.close()
    c = t.consumer("c", start=("timestamp", ts))
    events = drain(c)
    assert offsets(events) == list(range(5, 10))
    assert all(e.timestamp >= ts for e in events)
    c.seek("beginning")
    everything = drain(c)
    assert offsets(everything) == list(range(10))
    c.seek(("timestamp", everything[7].timestamp))
    assert drain(c)[0].timestamp == everything[7].timestamp


def test_seek_to_committed_returns_after_the_last_ack(seek_topic):
    t, _ = seek_topic
    c = t.consumer("c")
    events = take(c, 4)
    events[-1].ack().wait(timeout=30)
    assert offsets(take(c, 3)) == [4, 5, 6]
    c.seek("committed")
    assert offsets(take(c, 3)) == [4, 5, 6]


# ----------------------------------------------------------- end of stream


def test_end_of_stream_comes_only_after_every_producer_closed(driver, ptype):
    t = driver.create_topic("eos", 2, type=ptype)
    producers = [t.producer() for _ in range(3)]
    for k, p in enumerate(producers):
        push_n(p, 10, lambda i, k=k: bytes([k]))
    c = t.consumer("c")
    assert len(take(c, 30)) == 30
    with pytest.raises(strom.TimeoutError) as err:
        c.pull(timeout=0.3)
    assert err.value.code == 502
    producers[0].close()
    producers[1].close()
    with pytest.raises(strom.TimeoutError):
        c.pull(timeout=0.3)
    assert t.describe()["state"]["ended"] is False
    producers[2].push({"late": True}).wait()
    producers[2].close()
    assert c.pull(timeout=30).metadata == {"late": True}
    assert c.pull(timeout=30) is None, "end of stream after the last close"
    assert c.pull(timeout=30) is None, "and it stays"


def test_complete_ends_the_stream_with_a_producer_open_and_rejects_pushes(driver, ptype):
    t = driver.create_topic("complete", 1, type=ptype)
    p = t.producer()
    push_n(p, 5)
    t.complete()
    assert offsets(drain(t.consumer("c"))) == list(range(5))
    with pytest.raises(strom.TopicClosed) as err:
        p.push({"x": 1}).wait(timeout=30)
    assert err.value.code == 204
    assert t.describe()["state"]["ended"]


def test_process_calls_start_then_each_event_in_order_then_end(driver, ptype):
    t = driver.create_topic("proc", 1, type=ptype)
    p = t.producer()
    push_n(p, 20)
    p.close()
    calls = []
    t.consumer("c").process(
        lambda e: calls.append(("event", e.metadata["i"])),
        on_start=lambda: calls.append(("start",)),
        on_end=lambda: calls.append(("end",)),
    )
    assert calls == [("start",)] + [("event", i) for i in range(20)] + [("end",)]


def test_process_on_an_empty_completed_topic_calls_start_then_end(driver, ptype):
    t = driver.create_topic("empty", 1, type=ptype)
    t.complete()
    calls = []
    t.consumer("c").process(
        lambda e: calls.append("event"),
        on_start=lambda: calls.append("start"),
        on_end=lambda: calls.append("end"),
    )
    assert calls == ["start", "end"]


def test_process_stops_on_a_callback_exception(driver, ptype):
    t = driver.create_topic("procx", 1, type=ptype)
    p = t.producer()
    push_n(p, 3)
    p.close()

    def boom(e):
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        t.consumer("c").process(boom)


def test_empty_and_multi_segment_data_arrive_concatenated(driver, ptype):
    t = driver.create_topic("segs", 1, type=ptype)
    p = t.producer()
    want = [
        b"",
        b"single",
        b"head" + bytes(range(256)) + b"tail",
        b"",
        b"x" * 100_000 + b"y" * 3,
    ]
    p.push({"k": 0})
    p.push({"k": 1}, b"single")
    p.push({"k": 2}, [b"head", bytearray(range(256)), memoryview(b"tail")])
    p.push({"k": 3}, [b"", b""])
    p.push({"k": 4}, (b"x" * 100_000, b"yyy"))
    p.close()
    events = drain(t.consumer("c"))
    assert [e.metadata["k"] for e in events] == list(range(5))
    for e in events:
        w = want[e.metadata["k"]]
        assert e.data_size == len(w)
        assert bytes(e.data) == w


# ---------------------------------------------------------- partitioning


def test_round_robin_spreads_events_over_every_partition(driver, ptype):
    t = driver.create_topic("rr", 4, type=ptype)
    p = t.producer()
    ids = push_n(p, 40)
    p.close()
    per = [sum(1 for i in ids if i.partition == k) for k in range(4)]
    assert per == [10, 10, 10, 10]
    events = drain(t.consumer("c"))
    assert sorted((e.partition, e.offset) for e in events) == sorted((i.partition, i.offset) for i in ids)


def test_hash_selector_sends_equal_keys_to_one_partition(driver, ptype):
    t = driver.create_topic("hash", 4, type=ptype, selector="hash:run")
    p = t.producer()
    futs = [p.push({"run": f"r{i % 3}", "i": i}) for i in range(30)]
    p.close()
    by_run = {}
    for i, f in enumerate(futs):
        by_run.setdefault(f"r{i % 3}", set()).add(f.wait().partition)
    assert all(len(s) == 1 for s in by_run.values()), by_run


def test_explicit_partition_is_honoured(driver, ptype):
    t = driver.create_topic("explicit", 3, type=ptype, selector="explicit")
    p = t.producer()
    assert p.push({"x": 1}, partition=2).wait().partition == 2
    with pytest.raises(strom.StromError) as err:
        p.push({"x": 1})
    assert err.value.code == 402, "explicit selector without a partition"
    p.close()


def test_consumer_restricted_to_a_partition_sees_only_that_partition(driver, ptype):
    t = driver.create_topic("restrict", 3, type=ptype)
    p = t.producer()
    push_n(p, 30)
    p.close()
    events = drain(t.consumer("c", partitions=[1]))
    assert len(events) == 10 and {e.partition for e in events} == {1}


def test_iterating_a_consumer_ends_at_end_of_stream(driver, ptype):
    t = driver.create_topic("iter", 2, type=ptype)
    p = t.producer()
    push_n(p, 25)
    p.close()
    seen = [e.metadata["i"] for e in t.consumer("c")]
    assert sorted(seen) == list(range(25))


# ---------------------------------------------------------------- admin


def test_topic_administration_and_error_codes(driver):
    driver.create_topic("a", 2, type="memory")
    with pytest.raises(strom.TopicExists) as err:
        driver.create_topic("a")
    assert err.value.code == 201
    with pytest.raises(strom.TopicNotFound) as err:
        driver.open_topic("missing")
    assert err.value.code == 200 and err.value.code_name == "TOPIC_NOT_FOUND"
    with pytest.raises(strom.InvalidArgument):
        driver.create_topic("b", type="tape")
    assert [t["name"] for t in driver.list_topics()] == ["a"]
    info = driver.describe("a")
    assert info["type"] == "memory" and len(info["partitions"]) == 2
    driver.delete_topic("a")
    assert driver.list_topics() == []


def test_metadata_accepts_dict_str_and_bytes_and_rejects_non_json_values(driver):
    t = driver.create_topic("meta", 1, type="memory")
    p = t.producer()
    p.push({"s": "é\"\n", "f": 1.25, "n": None, "b": False, "l": [1, (2, 3)], "big": 2**63})
    p.push('{"from": "str"}')
    p.push(b'{"from": "bytes"}')
    with pytest.raises(TypeError):
        p.push({"x": object()})
    with pytest.raises(ValueError):
        p.push({"x": float("nan")})
    p.close()
    a, b, c = drain(t.consumer("c"))
    assert a.metadata == {"s": "é\"\n", "f": 1.25, "n": None, "b": False, "l": [1, [2, 3]], "big": 2**63}
    assert b.metadata == {"from": "str"} and c.metadata == {"from": "bytes"}
    assert a.metadata is a.metadata, "decoded once and cached"


def test_connect_to_a_real_server_process(server):
    d = strom.Driver.connect(server.group_file)
    t = d.create_topic("remote", 2)
    with t.producer() as p:
        push_n(p, 10, lambda i: bytes([i]) * 1000)
    events = drain(d.open_topic("remote").consumer("c"))
    assert sorted(e.metadata["i"] for e in events) == list(range(10))
    assert all(bytes(e.data) == bytes([e.metadata["i"]]) * 1000 for e in events)
