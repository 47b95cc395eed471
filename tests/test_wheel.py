"""The binary wheel's requirements that a quick test can check (the wheel itself is built and
tested by `.ci/wheel`, docs/installing.md "Wheels").

The wheel's native torch library links its own C++ runtime (zig's libc++, statically), while torch
uses libstdc++: an exception must never unwind from one runtime's frames into the other's.  Each
op's entry point (``guarded<op>`` in perfkernels/torch/native/torch_api.h) catches everything the
op throws and raises torch's c10::Error from a frame with nothing to clean up; an op registered
without it would crash the wheel's library on its first bad argument.
"""
import re
from pathlib import Path

NATIVE = Path(__file__).resolve().parent.parent / "perfkernels" / "torch" / "native"


def _ops_table() -> str:
    text = (NATIVE / "ops.cpp").read_text()
    start = text.index("const Op OPS[] = {")
    return text[start:text.index("\n};", start)]


def test_every_native_op_is_registered_through_its_guard():
    entries = re.findall(r'\{\s*"(\w+)",\s*((?:"[^"]*"\s*)+),\s*([^{}]+?)\s*\}', _ops_table())
    assert len(entries) >= 18, entries               # the table was read
    unguarded = [(name, fn) for name, _schema, fn in entries
                 if not re.fullmatch(r"guarded<\w+>", fn)]
    assert not unguarded, f"ops registered without guarded<...>: {unguarded}"


def test_registration_passes_only_the_table_entries():
    """The ops are registered from the table alone (no kernel handed to torch elsewhere)."""
    text = (NATIVE / "ops.cpp").read_text()
    calls = re.findall(r"torch_library_impl\(([^;]*)\)", text)
    assert calls and all("op.fn" in c for c in calls), calls
