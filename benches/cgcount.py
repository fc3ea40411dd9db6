#!/usr/bin/env python3
"""Totals of a callgrind output file (benches/compare.sh): instructions executed (Ir) and
heap allocations. The gateway's global allocator is mimalloc, so valgrind's own heap
summary misses Rust allocations; they are counted here as the calls made to
`__rust_alloc`, `__rust_alloc_zeroed` and `__rust_realloc` (every `calls=` line whose
callee is one of them, summed over all callers).

    cgcount.py FILE      -> prints "IR ALLOCS"
"""
import re
import sys

ALLOC = re.compile(r"__rust_(alloc|alloc_zeroed|realloc)$")
NAME = re.compile(r"c?fn=\((\d+)\)(?: (.*))?")
names = {}
allocs = 0
ir = None
callee = None
with open(sys.argv[1], errors="replace") as f:
    for line in f:
        if line.startswith(("fn=", "cfn=")):
            m = NAME.match(line.rstrip("\n"))
            if m:
                if m.group(2):
                    names[m.group(1)] = m.group(2)
                if line.startswith("cfn="):
                    callee = names.get(m.group(1), "")
        elif line.startswith("calls="):
            if callee is not None and ALLOC.search(callee):
                allocs += int(line[6:].split()[0])
            callee = None
        elif line.startswith(("summary:", "totals:")) and ir is None:
            ir = int(line.split()[1])
if ir is None:
    sys.exit(f"cgcount: no totals in {sys.argv[1]}")
print(ir, allocs)
