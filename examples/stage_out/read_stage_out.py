"""Read a Strom stage-out without Strom: only the standard library and numpy.

`strom topic stage-out TOPIC --to DIR` writes DIR/TOPIC/ (see
docs/stage-out.md): MANIFEST.json, and per partition pN/events.jsonl with
one index line per event, plus the data in pN/data.bin (raw) or in one
pN/<offset>.npy per array event (npy). This script checks a stage-out
against its manifest and prints what it holds:

    python read_stage_out.py DIR/TOPIC            # a summary per partition
    python read_stage_out.py DIR/TOPIC --dump     # one JSON line per event

Each --dump line holds the event's partition, offset, metadata, data_len,
its data as hex (`data_hex`, null without data or with --format jsonl) and,
for an array event, `array` with dtype, shape, and the elements in C order
as hex (`c_order_hex`), read with numpy. Exit status 1, with the reason on
stderr, when the stage-out is incomplete or does not match its manifest.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np


class Invalid(Exception):
    """The stage-out is incomplete or inconsistent."""


def load_manifest(root: str) -> dict:
    path = os.path.join(root, "MANIFEST.json")
    if not os.path.exists(path):
        raise Invalid(f"{root}: no MANIFEST.json, so not a complete stage-out")
    with open(path, encoding="utf-8") as f:
        manifest = json.load(f)
    if manifest.get("format_name") != "strom-stage-out":
        raise Invalid(f"{path}: not a strom stage-out manifest")
    if manifest.get("format_version") != 1:
        raise Invalid(f"{path}: format_version {manifest.get('format_version')}, this reader knows 1")
    return manifest


def metadata(line: dict):
    """The event's metadata: a JSON value, or bytes when it was not JSON."""
    if line["metadata_encoding"] == "json":
        return line["metadata"]
    return bytes.fromhex(line["metadata"])


def read_range(path: str, offset: int, length: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(length)
    if len(data) != length:
        raise Invalid(f"{path}: {length} bytes at {offset} wanted, {len(data)} there")
    return data


def as_array(line: dict, data: bytes) -> np.ndarray:
    """The data of a raw event whose descriptor describes an array."""
    a = line["array"]
    return np.frombuffer(data, dtype=np.dtype(a["dtype"])).reshape(a["shape"], order=a["order"])


def event_data(pdir: str, line: dict):
    """(bytes, numpy array or None) of one event, or (None, None)."""
    where = line.get("data")
    if where is None:
        return None, None
    path = os.path.join(pdir, where["file"])
    data = read_range(path, where["offset"], where["length"])
    if where["format"] == "npy":
        arr = np.load(path, allow_pickle=False)
        # The .npy file's own header must describe exactly these bytes.
        if arr.tobytes(order="A") != data:
            raise Invalid(f"{path}: np.load does not give the bytes at the index's offset")
        return data, arr
    if "array" in line and len(data) == line["data_len"]:
        try:
            return data, as_array(line, data)
        except (TypeError, ValueError):
            return data, None
    return data, None


def dump_line(line: dict, data, arr) -> dict:
    out = {
        "partition": line["partition"],
        "offset": line["offset"],
        "metadata_encoding": line["metadata_encoding"],
        "metadata": line["metadata"],
        "data_len": line["data_len"],
        "data_hex": None if data is None else data.hex(),
        "file_format": None if line.get("data") is None else line["data"]["format"],
    }
    if "metadata_decoded" in line:
        out["metadata_decoded"] = line["metadata_decoded"]
    if arr is not None:
        out["array"] = {
            "dtype": arr.dtype.str,
            "shape": list(arr.shape),
            "c_order_hex": arr.tobytes(order="C").hex(),
        }
    return out


def read_partition(root: str, manifest: dict, part: dict, dump) -> dict:
    """Reads one partition; checks it against the manifest."""
    pdir = os.path.join(root, part["dir"])
    events = data_bytes = 0
    with open(os.path.join(root, part["index"]), encoding="utf-8") as f:
        for text in f:
            line = json.loads(text)
            if line["partition"] != part["id"]:
                raise Invalid(f"{part['index']}: line of partition {line['partition']}")
            metadata(line)
            data, arr = event_data(pdir, line)
            if manifest["format"] != "jsonl" and line["data_len"] > 0 and data is None:
                raise Invalid(f"{part['index']}: offset {line['offset']} has no data file")
            if data is not None and len(data) != line["data_len"]:
                raise Invalid(f"{part['index']}: offset {line['offset']}: data_len mismatch")
            events += 1
            data_bytes += line["data_len"]
            if dump:
                dump(dump_line(line, data, arr))
    if (events, data_bytes) != (part["events"], part["data_bytes"]):
        raise Invalid(
            f"partition {part['id']}: {events} events, {data_bytes} bytes; "
            f"the manifest says {part['events']}, {part['data_bytes']}"
        )
    return {"id": part["id"], "events": events, "data_bytes": data_bytes}


def read_stage_out(root: str, dump=None) -> dict:
    manifest = load_manifest(root)
    parts = [read_partition(root, manifest, p, dump) for p in manifest["partitions"]]
    total = sum(p["events"] for p in parts)
    if total != manifest["events"]:
        raise Invalid(f"{total} events, the manifest says {manifest['events']}")
    return {"manifest": manifest, "partitions": parts}


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    if len(args) != 1 or any(a not in ("--dump",) for a in argv if a.startswith("--")):
        print(__doc__, file=sys.stderr)
        return 2
    dump = None
    if "--dump" in argv:
        def dump(obj: dict) -> None:
            print(json.dumps(obj, sort_keys=True))
    try:
        result = read_stage_out(args[0], dump)
    except (Invalid, OSError, ValueError, KeyError) as e:
        print(f"read_stage_out: {e}", file=sys.stderr)
        return 1
    if dump is None:
        m = result["manifest"]
        print(f"topic {m['topic']}: {m['events']} events, {m['data_bytes']} data bytes, "
              f"format {m['format']}, strom {m['strom_version']}")
        for p in result["partitions"]:
            print(f"  partition {p['id']}: {p['events']} events, {p['data_bytes']} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
