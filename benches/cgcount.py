#!/usr/bin/env python3
"""Totals of a callgrind output file (benches/compare.sh): instructions executed (Ir) and
heap allocations. The gateway's global allocator is mimalloc, so valgrind's own heap
summary misses Rust allocations; they are counted here from the call graph, as calls made
from ordinary code into an allocation entry point: `__rust_alloc`, `__rust_alloc_zeroed`,
`__rust_realloc`, or mimalloc's own `mi_malloc_aligned` / `mi_zalloc_aligned` /
`mi_realloc_aligned` (and their unaligned forms). Calls between the allocator's own
functions (`__rust_alloc` calling `mi_malloc_aligned`, mimalloc internals) are not counted,
so each allocation counts once.

Both entry points are needed: in the crate that declares `#[global_allocator]` (the bare
Pingora proxy, benches/bare_proxy.rs, where Pingora's generic code is instantiated), LLVM
inlines `__rust_alloc` and the code calls `mi_malloc_aligned` directly; counting only
`__rust_alloc` would miss about a third of the bare proxy's allocations.

    cgcount.py FILE      -> prints "IR ALLOCS"
"""
import re
import sys

# Where an allocation enters the allocator (a reallocation counts as one).
ENTRY = re.compile(
    r"^(?:__rustc::)?__rust_(?:alloc|alloc_zeroed|realloc)$"
    r"|^__rg_(?:alloc|alloc_zeroed|realloc)$"
    r"|^<mimalloc::MiMalloc as core::alloc::global::GlobalAlloc>::(?:alloc|alloc_zeroed|realloc)$"
    r"|^mi_(?:malloc|zalloc|calloc|realloc|reallocf|malloc_aligned|zalloc_aligned|realloc_aligned)$"
)
# The allocator itself: calls from these are part of an allocation already counted.
INTERNAL = re.compile(r"^(?:__rustc::)?__(?:rust|rg|rdl)_|^_?mi_|^<mimalloc::")
NAME = re.compile(r"c?fn=\((\d+)\)(?: (.*))?")
names = {}
allocs = 0
ir = None
caller = ""
callee = None
with open(sys.argv[1], errors="replace") as f:
    for line in f:
        if line.startswith(("fn=", "cfn=")):
            m = NAME.match(line.rstrip("\n"))
            if m:
                if m.group(2):
                    names[m.group(1)] = m.group(2)
                name = names.get(m.group(1), "")
                if line.startswith("cfn="):
                    callee = name
                else:
                    caller = name
        elif line.startswith("calls="):
            if callee is not None and ENTRY.search(callee) and not INTERNAL.search(caller):
                allocs += int(line[6:].split()[0])
            callee = None
        elif line.startswith(("summary:", "totals:")) and ir is None:
            ir = int(line.split()[1])
if ir is None:
    sys.exit(f"cgcount: no totals in {sys.argv[1]}")
print(ir, allocs)
