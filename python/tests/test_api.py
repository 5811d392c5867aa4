"""The package's surface: every public class, function and method has a
docstring, and the type stubs name every class the extension exports."""

from __future__ import annotations

import inspect
from pathlib import Path

import strom
import strom.select


def public_members(obj):
    for name, member in inspect.getmembers(obj):
        if not name.startswith("_"):
            yield name, member


def test_every_public_class_and_method_has_a_docstring():
    missing = []
    for name in strom.__all__:
        obj = getattr(strom, name)
        if inspect.ismodule(obj):
            continue
        if not (obj.__doc__ or "").strip():
            missing.append(name)
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            for mname, member in public_members(obj):
                if not (getattr(member, "__doc__", None) or "").strip():
                    missing.append(f"{name}.{mname}")
    for name in strom.select.__all__:
        if not (getattr(strom.select, name).__doc__ or "").strip():
            missing.append(f"select.{name}")
    assert not missing, f"no docstring: {missing}"


def test_type_stubs_cover_every_exported_class():
    stub = (Path(strom.__file__).parent / "_strom.pyi").read_text()
    for name in ("Driver", "Topic", "Producer", "PushFuture", "PushFutures", "EventId", "Consumer", "Event", "AckFuture", "Buffer", "Selection"):
        assert f"class {name}" in stub, name
    assert (Path(strom.__file__).parent / "py.typed").exists()


def test_errors_carry_stable_codes():
    e = strom.errors.TopicNotFound("x", 200, "TOPIC_NOT_FOUND")
    assert isinstance(e, strom.StromError) and isinstance(e, LookupError)
    assert (e.code, e.code_name) == (200, "TOPIC_NOT_FOUND")
    assert issubclass(strom.TimeoutError, TimeoutError)


def test_safety_error_codes_have_their_own_classes_carrying_the_code():
    expected = {
        "PartitionUnavailable": (207, "PARTITION_UNAVAILABLE"),
        "DataDirLocked": (208, "DATA_DIR_LOCKED"),
        "GroupFileLive": (209, "GROUP_FILE_LIVE"),
        "DataCorrupt": (309, "DATA_CORRUPT"),
        "DataExpired": (310, "DATA_EXPIRED"),
        "PartitionFailed": (311, "PARTITION_FAILED"),
    }
    for name, (code, code_name) in expected.items():
        cls = getattr(strom.errors, name)
        assert getattr(strom, name) is cls and name in strom.__all__ and name in strom.errors.__all__
        assert issubclass(cls, strom.StromError)
        # The class itself and an instance built without a code both carry it.
        assert (cls.code, cls.code_name) == (code, code_name), name
        e = cls("partition 3 of 'frames'")
        assert (e.code, e.code_name) == (code, code_name), name
        assert str(e) == f"partition 3 of 'frames' [{code_name} ({code})]"
        # As the extension raises it: message, code and name given.
        e = cls("boom", code, code_name)
        assert (e.code, e.code_name) == (code, code_name), name
