"""AVX-512 kernels run on a CPU without AVX-512, one instruction at a time, under Bochs.

QEMU's user mode has no AVX-512, so on an AVX2-only machine the AVX-512 kernels would never run
in a test.  Bochs emulates every AVX-512 subset our kernels use (F, BW, DQ, VL).  ``bochscpu`` (``pip install bochscpu-python``) is Bochs' CPU as a library: it runs
x86-64 code on guest pages that map straight onto host pages.  This module maps the whole address
space of the test process into the guest (every readable region of ``/proc/self/maps``, guest
virtual address = host virtual address), so a kernel called in the emulator reads the same NumPy
arrays, writes the same outputs and calls the same helpers (``memset``, the stack protector's
thread-local canary) as a native call would.  A call returns when the kernel's ``ret`` lands on
a page of ``hlt`` bytes whose address was pushed as the return address.

:func:`install` swaps each family's AVX-512 row of its dispatch table (``pk_<family>_table``,
read-only data made writable with ``mprotect``) for ctypes callbacks that run the original
AVX-512 function here, and marks the AVX-512 level as runnable; the Python API, the multi-table
call and the torch fast path then reach the AVX-512 kernels through their usual dispatch, and the
test suite's ``isa`` fixture runs its AVX-512 cases.  ``tests/conftest.py`` calls it when
``PERFKERNELS_EMULATE_AVX512=1``; ``tests/test_emulated_avx512.py`` runs the AVX-512 cases of
every kernel family's tests that way.  Only integer and pointer arguments are supported: every kernel
signature in ``include/perfkernels/`` is of that kind (``_codegen`` parses them).  A kernel that
faults or makes a system call in the emulator raises :class:`EmulationError` naming the address.
"""
from __future__ import annotations

import atexit
import ctypes
import glob
import mmap
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PAGE = 4096
_DATA_GPA = 0x1000_0000  # guest physical: page tables below, the process's pages from here
_SKIP_REGIONS = ("[vsyscall]", "[vvar]", "[vvar_vclock]")
_GUEST_XCR0 = 0xE7  # x87, SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM state enabled


class EmulationError(RuntimeError):
    """The emulated call raised a CPU exception (a fault, an instruction Bochs refuses)."""


def _glibc_shim() -> None:
    """bochscpu-python 0.4.0's wheel calls two C23 names of glibc 2.38 (``__isoc23_strtoull``,
    ``__isoc23_sscanf``); on an older glibc, define them over the classic functions first."""
    libc = ctypes.CDLL(None)
    if hasattr(libc, "__isoc23_strtoull"):
        return
    source = (
        "#include <stdarg.h>\n#include <stdio.h>\n#include <stdlib.h>\n"
        "unsigned long long __isoc23_strtoull(const char *s, char **e, int b)"
        " { return strtoull(s, e, b); }\n"
        "int __isoc23_sscanf(const char *s, const char *f, ...)"
        " { va_list a; va_start(a, f); int r = vsscanf(s, f, a); va_end(a); return r; }\n")
    # the loaded library stays mapped once its file is gone: nothing is left in the temp folder
    with tempfile.TemporaryDirectory(prefix="perfkernels-bochs-") as name:
        folder = Path(name)
        (folder / "shim.c").write_text(source)
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", str(folder / "shim.c"), "-o",
                        str(folder / "shim.so")], check=True, capture_output=True)
        ctypes.CDLL(str(folder / "shim.so"), mode=ctypes.RTLD_GLOBAL)


def import_bochscpu():
    """The ``bochscpu`` module (``ImportError`` when bochscpu-python is not installed)."""
    _glibc_shim()
    import bochscpu
    import bochscpu.cpu
    import bochscpu.memory
    return bochscpu


def _thread_fs_base() -> int:
    """This thread's FS base (its thread-local block: glibc's stack canary lives at fs:0x28)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    value = ctypes.c_uint64()
    if libc.syscall(158, 0x1003, ctypes.byref(value)) != 0:  # arch_prctl(ARCH_GET_FS, &value)
        raise OSError(ctypes.get_errno(), "arch_prctl(ARCH_GET_FS) failed")
    return value.value


def _readable_regions(maps: bytes):
    """(lo, hi) of each readable region in the text of ``/proc/self/maps``."""
    for line in maps.splitlines():
        parts = line.split()
        if b"r" not in parts[1] or (len(parts) > 5 and parts[5].decode() in _SKIP_REGIONS):
            continue
        lo, hi = (int(x, 16) for x in parts[0].split(b"-"))
        yield lo, hi


class Emulator:
    """Calls x86-64 functions of this process in Bochs' CPU (integer and pointer arguments)."""

    def __init__(self) -> None:
        self.bochscpu = import_bochscpu()
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._session = None
        self.seconds_mapping = self.seconds_running = 0.0  # where the emulator's time went
        self.restarts = 0            # calls run again after a page fault on a page mapped since
        self.routed = self.checked = 0  # table entries routed here; those checked by symbol
        self.calls = 0
        # the call's stack (1 MiB) and its return page of hlt bytes, allocated once
        self._stack = ctypes.create_string_buffer(1 << 20)
        self._stop = ctypes.create_string_buffer(b"\xf4" * (2 * PAGE))
        self._stop_at = (ctypes.addressof(self._stop) + PAGE - 1) & ~(PAGE - 1)
        # 4-level page tables written here, in pages of host memory this object owns
        self._table_pages: list = []
        self._children: dict = {}    # (shift, va >> shift) -> the next level's (entries, gpa)
        self._pml4, self._pml4_gpa = self._table_page()
        self._maps = b""             # /proc/self/maps at the last call, and its lines
        self._lines: set = set()
        self._mapped_to: dict = {}   # a region's start -> the end up to which it is mapped
        self._pages: dict = {}       # page's virtual address -> its guest physical address

    @staticmethod
    def _missing_page(gpa):
        raise EmulationError(f"the emulated call touched unmapped guest memory {gpa:#x}")

    def _table_page(self):
        """A new zeroed page-table page: its entries (ctypes array over host memory) and its gpa."""
        page = mmap.mmap(-1, PAGE)
        entries = (ctypes.c_uint64 * 512).from_buffer(page)
        gpa = PAGE * (1 + len(self._table_pages))
        if gpa >= _DATA_GPA:
            raise EmulationError("the emulator ran out of guest memory for page tables")
        self._table_pages.append((page, entries))
        self.bochscpu.memory.page_insert(gpa, ctypes.addressof(entries))
        return entries, gpa

    def _map_page(self, va: int) -> None:
        """Map the host page at ``va`` to guest virtual ``va`` (present, writable, user)."""
        gpa = _DATA_GPA + PAGE * len(self._pages)
        self._pages[va] = gpa
        self.bochscpu.memory.page_insert(gpa, va)
        table = self._pml4
        for shift in (39, 30, 21):
            index = (va >> shift) & 511
            child = self._children.get((shift, va >> shift))
            if child is None:
                child = self._table_page()
                self._children[(shift, va >> shift)] = child
                table[index] = child[1] | 0x7
            table = child[0]
        table[(va >> 12) & 511] = gpa | 0x7

    def _map_process(self) -> int:
        """Map every readable page of the process into the guest (guest virtual = host virtual);
        pages mapped at an earlier call stay mapped, so a call maps only what is new."""
        with open("/proc/self/maps", "rb") as file:
            maps = file.read()
        if maps == self._maps:  # most calls: nothing was mapped or unmapped since the last
            return self._pml4_gpa
        self._maps = maps
        lines = set(maps.splitlines())
        fresh, self._lines = lines - self._lines, lines
        for lo, hi in _readable_regions(b"\n".join(fresh)):
            # a region seen before that grew (the heap, a stack) maps only its new end
            start = self._mapped_to.get(lo, lo)
            if start >= hi:
                continue
            self._mapped_to[lo] = hi
            for va in range(start, hi, PAGE):
                if va not in self._pages:
                    self._map_page(va)
        return self._pml4_gpa

    def _segment(self, selector, attr, base=0):
        seg = self.bochscpu.Segment()
        seg.present, seg.selector, seg.base, seg.limit, seg.attr = True, selector, base, 0xFFFFFFFF, attr
        return seg

    def call(self, address: int, *args: int, restartable: bool = False) -> int:
        """Run the function at ``address`` with integer arguments; its ``rax`` (the return value).
        ``restartable``: the function only writes its outputs, so it may be run again from its
        start (after a page fault on memory the process mapped since the last call).

        Any thread may call; the emulation itself runs on one thread of its own, one call at a
        time (Bochs' CPU is not to be driven from several threads), with the calling thread's
        thread-local block."""
        job = (address, args, _thread_fs_base(), restartable, threading.Event(), [])
        with self._lock:
            if self._worker is None:
                self._worker = threading.Thread(target=self._serve, name="bochs", daemon=True)
                self._worker.start()
                atexit.register(self.close)
            self.calls += 1
        self._jobs.put(job)
        job[4].wait()
        outcome = job[5][0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def close(self) -> None:
        """End the emulation thread and free Bochs' session (at exit, before Python's finalization,
        which would otherwise tear the session down under the running thread)."""
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            self._jobs.put(None)
            worker.join()

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:  # close(): the session goes with the thread that made it
                self._session = None
                return
            address, args, fs_base, restartable, done, result = job
            try:
                result.append(self._run(address, args, fs_base, restartable))
            except BaseException as exc:  # handed to the caller
                result.append(exc)
            done.set()

    def _run(self, address: int, args, fs_base: int, restartable: bool) -> int:
        if self._session is None:
            self._session = self.bochscpu.Session()
            self._session.missing_page_handler = self._missing_page
        # A kernel that only writes its outputs may run on the pages mapped so far and start
        # again from scratch after a page fault on a page mapped since (reading /proc/self/maps
        # costs 1-2 ms, far more than most emulated calls); any other kernel (one that updates a
        # table in place) maps every new page before it starts.
        if not restartable or not self._maps:
            self._timed_map()
        while True:
            fault = self._attempt(address, args, fs_base)
            if fault is None:
                return self._session.cpu.state.rax
            vector, error_code, rip, cr2 = fault
            if restartable and vector == 14 and (cr2 & ~(PAGE - 1)) not in self._pages:
                self._timed_map()
                if (cr2 & ~(PAGE - 1)) in self._pages:
                    self.restarts += 1
                    continue  # the page exists now: run the call again from its start
            raise EmulationError(f"emulated call of {address:#x}: CPU exception {vector} (error "
                                 f"code {error_code}) at rip {rip:#x}, cr2 {cr2:#x}")

    def _timed_map(self) -> None:
        started = time.perf_counter()
        self._map_process()
        self.seconds_mapping += time.perf_counter() - started

    def _attempt(self, address: int, args, fs_base: int):
        """One run of the call from its first instruction: None when it returned, else the CPU
        exception that stopped it (vector, error code, rip, cr2)."""
        bx, session = self.bochscpu, self._session
        state = bx.State()
        bx.cpu.set_long_mode(state)
        state.cr4 = state.cr4 | (1 << 9) | (1 << 10) | (1 << 18)  # OSFXSR, OSXMMEXCPT, OSXSAVE
        state.xcr0 = _GUEST_XCR0
        state.mxcsr = 0x1F80
        state.fpcw = 0x37F
        state.cr3 = self._pml4_gpa
        # System V: six integer arguments in registers, the rest on the stack above the return
        # address; rsp + 8 is 16-byte aligned at the function's first instruction
        top = (ctypes.addressof(self._stack) + len(self._stack) - 256) & ~0xF
        stacked = list(args[6:])
        rsp = top - 8 * (len(stacked) + (len(stacked) % 2)) - 8
        ctypes.c_uint64.from_address(rsp).value = self._stop_at
        for i, value in enumerate(stacked):
            ctypes.c_uint64.from_address(rsp + 8 * (i + 1)).value = value & (2**64 - 1)
        for name, value in zip(("rdi", "rsi", "rdx", "rcx", "r8", "r9"), args):
            setattr(state, name, value & (2**64 - 1))
        state.rsp, state.rip, state.rflags = rsp, address, 0x202
        data = self._segment(0x2B, 0xCF3)
        state.cs = self._segment(0x33, 0x22FB)
        state.ds = state.ss = state.es = state.gs = data
        state.fs = self._segment(0x2B, 0xCF3, fs_base)
        session.cpu.state = state
        fault = []

        def exception(sess, cpu, vector, error_code):
            fault.append((vector, error_code, sess.cpu.state.rip, sess.cpu.state.cr2))
            sess.stop()

        def halt(sess, cpu):
            sess.stop()

        hook = bx.Hook()
        hook.exception = exception
        hook.hlt = halt  # bochscpu calls every hook it has: leave none unset that can fire
        started = time.perf_counter()
        session.run([hook])
        self.seconds_running += time.perf_counter() - started
        # the kernel returned: hlt at user level is a #GP on the stop page
        if fault and fault[0][2] in (self._stop_at, self._stop_at + 1):
            return None
        return fault[0] if fault else (-1, 0, session.cpu.state.rip, 0)


#: the families whose kernels only write their outputs (never read them, never update a table in
#: place), so that a call may be run again from its start
RESTARTABLE = frozenset({"embedding", "quantized", "sequence", "convert"})

_installed: list = []      # the callbacks (kept alive) once install() ran
_emulator: Emulator | None = None


def _family_modules():
    """(family, its extension module's path, its header's kernels) for every family with kernels."""
    import perfkernels
    from perfkernels import _codegen, _registry
    root = Path(perfkernels.__file__).resolve().parent
    source_root = Path(__file__).resolve().parents[2]
    for family in _registry.FAMILIES:
        header = _codegen.header_path(source_root, family.name)
        if not header.exists():
            continue
        kernels = _codegen.kernels(_codegen.parse_header(header.read_text()), family.name)
        if not kernels:
            continue
        found = glob.glob(str(root / "families" / family.name / f"_{family.name}*.so"))
        if found:
            yield family.name, found[0], kernels


def install(isa: str = "avx512") -> Emulator:
    """Route every family's kernels of level ``isa`` through the emulator and mark the level
    runnable.  Once per process: the tables stay patched until it exits."""
    global _emulator
    if _emulator is not None:
        raise RuntimeError("the emulator is installed already (once per process)")
    from perfkernels import _dispatch
    emulator = Emulator()
    level = _dispatch.ISAS.index(isa)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for family, path, kernels in _family_modules():
        lib = ctypes.CDLL(path)
        getter = getattr(lib, f"pk_{family}_table")
        getter.restype, getter.argtypes = ctypes.c_void_p, [ctypes.c_int]
        row = getter(level)
        if not row:
            continue
        size = 8 * len(kernels)
        first = row & ~(PAGE - 1)
        if libc.mprotect(first, (row + size) - first, 1 | 2) != 0:  # PROT_READ | PROT_WRITE
            raise OSError(ctypes.get_errno(), f"mprotect of {family}'s dispatch table failed")
        slots = (ctypes.c_uint64 * len(kernels)).from_address(row)
        for i, (member, fn) in enumerate(kernels):
            native = slots[i]
            # the row holds this level's own functions (pk_<member>_<level>), never another's
            symbol = getattr(lib, f"pk_{member}_{isa}", None)
            emulator.routed += 1
            emulator.checked += symbol is not None
            if symbol is not None and ctypes.cast(symbol, ctypes.c_void_p).value != native:
                raise RuntimeError(f"{family}'s {isa} row holds {native:#x} for {member}, "
                                   f"not pk_{member}_{isa}")
            returns = fn.ret.strip() != "void"
            prototype = ctypes.CFUNCTYPE(ctypes.c_int64 if returns else None,
                                         *([ctypes.c_uint64] * len(fn.params)))

            def run(*args, _native=native, _returns=returns, _restart=family in RESTARTABLE):
                result = emulator.call(_native, *args, restartable=_restart)
                return ctypes.c_int64(result & (2**64 - 1)).value if _returns else None

            callback = prototype(run)
            _installed.append(callback)
            slots[i] = ctypes.cast(callback, ctypes.c_void_p).value
    for feature in _dispatch.REQUIREMENTS[isa]:
        _dispatch._features[feature] = True
    _emulator = emulator
    return emulator


def _sample_calls():
    """One call of each kernel family's public API on awkward shapes: name -> output array."""
    import numpy as np
    import perfkernels
    rng = np.random.default_rng(0)
    out = {}
    for dim in (1, 7, 16, 17, 64, 129):
        w = rng.standard_normal((50, dim), dtype=np.float32)
        idx = rng.integers(0, 50, 23)
        offs = np.array([0, 0, 5, 11, 23])
        weights = rng.standard_normal(23, dtype=np.float32)
        for name, table in (("f32", w), ("f16", w.astype(np.float16)),
                            ("bf16", perfkernels.float_to_bfloat16(w))):
            out[f"bag {name} D={dim}"] = perfkernels.embedding_bag(table, idx, offs)
            out[f"weighted mean {name} D={dim}"] = perfkernels.embedding_bag(
                table, idx.astype(np.int32), offs, per_sample_weights=weights, mode="mean")
        for bits in (8, 4, 2):
            packed = perfkernels.quantize_rowwise(w, bits=bits)
            out[f"quantize {bits} D={dim}"] = packed
            out[f"quantized bag {bits} D={dim}"] = perfkernels.embedding_bag_quantized(
                packed, idx, offs, bits=bits, dim=dim)
            out[f"dequantize {bits} D={dim}"] = perfkernels.dequantize_rowwise(packed, bits=bits, dim=dim)
        out[f"lookup f32 D={dim}"] = perfkernels.embedding(w, idx.reshape(-1, 1))
        out[f"to half D={dim}"] = perfkernels.float_to_half(w)
    return out


def self_check(isa: str = "avx2") -> None:
    """The ``isa`` kernels give, under the emulator, bit for bit what they give natively."""
    import numpy as np
    import perfkernels
    with perfkernels.use_isa(isa):
        native = _sample_calls()
    emulator = install(isa)
    print(f"{emulator.checked} of {emulator.routed} {isa} table entries checked against their symbols")
    with perfkernels.use_isa(isa):
        emulated = _sample_calls()
    assert emulator.calls >= len(native), (emulator.calls, len(native))
    for name, expected in native.items():
        got = emulated[name]
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        assert np.array_equal(got.view(np.uint8), expected.view(np.uint8)), f"{name} differs"
    print(f"self-check passed: {len(native)} {isa} results bit for bit, {emulator.calls} emulated calls")


if __name__ == "__main__":
    if "--self-check" in sys.argv:
        self_check()
    else:  # a quick look: one AVX-512 bag under the emulator
        import numpy as np
        install()
        import perfkernels
        w = np.random.default_rng(0).standard_normal((100, 37), dtype=np.float32)
        with perfkernels.use_isa("avx512"):
            got = perfkernels.embedding_bag(w, np.array([1, 5, 99]), np.array([0, 2]))
        print(np.abs(got - np.stack([w[1] + w[5], w[99]])).max(), _emulator.calls)
