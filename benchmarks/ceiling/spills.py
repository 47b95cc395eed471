"""Vector spills in the innermost loops of the compiled bag kernels, read from the disassembly.

For every function whose name contains ``--pattern`` (default ``bags_``: the bag loops' noinline
functions) in the float and quantized bag extensions, this finds the innermost loops (backward
jumps that contain no other), and counts, in each loop that does vector work, the vector loads
and stores addressed off the stack (``rsp`` / ``rbp``): an accumulator the register allocator
could not keep in a register costs one of each per row.  Each line is the worst loop of a
function, with its ISA (the widest vector register it uses).  A function of any D holds a loop per
rest width, so its worst loop need not be the one a given D runs: time a D before reading a
count as its cost.

    python benchmarks/ceiling/spills.py [--pattern bags_] [--all]

Static functions of the same name exist once per ISA level; each is listed apart.  Without
``--all`` only functions with spills are printed, grouped.  Needs ``objdump`` (binutils) and a
built perfkernels.  Known and measured: AVX2's 16-vector float passes (an unweighted float32
D = 256, a 16-bit D = 128) keep an accumulator on the stack (fewer passes over the indices; see
docs/benchmarking.md); packed rows on AVX2 take passes of 8 vectors, none of whose accumulators
leaves the registers (a pass of 16 needs 18 registers).  A function of any D may show one stack
access in a "loop" that is the bag's store (the tail mask), not the row loop.
"""
from __future__ import annotations

import argparse
import collections
import re
import subprocess

VEC = re.compile(r"[xyz]mm\d+")
STACK = re.compile(r"\((%rsp|%rbp)")
JUMP = re.compile(r"j\w+\s+([0-9a-f]+) <")


def functions(path: str):
    """(name, [(address, instruction)]) for every function of the object, in order."""
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], capture_output=True,
                         text=True, check=True).stdout
    cur = None
    for line in asm.splitlines():
        m = re.match(r"^([0-9a-f]+) <(.+)>:$", line)
        if m:
            if cur:
                yield cur
            cur = (m.group(2), [])
            continue
        m = re.match(r"^\s+([0-9a-f]+):\s+(.*)$", line)
        if m and cur:
            cur[1].append((int(m.group(1), 16), m.group(2)))
    if cur:
        yield cur


def worst_spills(ins) -> int:
    """The most stack vector accesses in one innermost vector loop of a function."""
    loops = [(int(m.group(1), 16), a) for a, t in ins for m in [JUMP.match(t)]
             if m and int(m.group(1), 16) < a]
    inner = [(lo, hi) for lo, hi in loops
             if not any((l2, h2) != (lo, hi) and lo <= l2 and h2 <= hi for l2, h2 in loops)]
    worst = 0
    for lo, hi in inner:
        body = [t for a, t in ins if lo <= a <= hi]
        if sum(1 for t in body if VEC.search(t)) >= 8:   # a vector loop
            worst = max(worst, sum(1 for t in body if VEC.search(t) and STACK.search(t)
                                   and "prefetch" not in t))
    return worst


def isa_of(ins) -> str:
    text = " ".join(t for _, t in ins)
    return "avx512" if "zmm" in text else "avx2" if "ymm" in text else "sse/scalar"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pattern", default="bags_")
    ap.add_argument("--all", action="store_true", help="every matching function, one per line")
    args = ap.parse_args(argv)
    from perfkernels.families.embedding import _embedding
    from perfkernels.families.quantized import _quantized
    for module in (_embedding, _quantized):
        print(f"== {module.__file__}")
        groups = collections.Counter()
        for name, ins in functions(module.__file__):
            if args.pattern not in name:
                continue
            n, isa = worst_spills(ins), isa_of(ins)
            if args.all:
                print(f"{n:3d}  {isa:10s} {name}")
            elif n:
                # the combination suffixes (index width, weighting, ...) grouped away
                groups[(n, isa, re.sub(r"(_[0-9]+)+(\.constprop\.\d+)?$", "", name))] += 1
        if not args.all:
            if not groups:
                print("  no vector spills in any innermost loop")
            for (n, isa, stem), count in sorted(groups.items(), key=lambda kv: -kv[0][0]):
                print(f"  {n:3d} stack accesses a row  {isa:10s} {stem} ({count} functions)")


if __name__ == "__main__":
    main()
