#!/usr/bin/env python3
"""Import cycles between a crate's modules: `python3 scripts/module-cycles.py crates/agent/src [DEPTH] [-v]`.

A module is a file or directory under SRC, taken to DEPTH path components (1: top-level
modules, the default). An edge A -> B is any `crate::B...` path in A's non-test code
(comment lines, `*tests.rs` files, `*_tests/` directories and a trailing
`#[cfg(test)] mod NAME {` and what follows it are skipped). Prints the strongly connected components of more than
one module (the cycles); -v lists every edge too.
"""
import os
import re
import sys

args = [a for a in sys.argv[1:] if a != '-v']
if not args:
    sys.exit(__doc__)
root = args[0]
depth = int(args[1]) if len(args) > 1 else 1
mods = {}
for dp, _, fn in os.walk(root):
    for f in fn:
        if not f.endswith('.rs'):
            continue
        p = os.path.join(dp, f)
        parts = os.path.relpath(p, root)[:-3].split('/')
        if parts[-1] == 'mod':
            parts = parts[:-1]
        if parts in (['lib'], ['main']):
            continue
        mods.setdefault('::'.join(parts[:depth]), []).append(p)
names = set(mods)


def target(path):
    for k in range(len(path), 0, -1):
        cand = '::'.join(path[:k])
        if cand in names:
            return cand
    return None


edges = {m: set() for m in names}
for m, files in mods.items():
    for p in files:
        if p.endswith('tests.rs') or '_tests/' in p or '/tests/' in p:
            continue
        src = '\n'.join(line for line in open(p).read().split('\n') if not line.strip().startswith('//'))
        trailing = re.search(r'^#\[cfg\(test\)\]\nmod [a-z_0-9]+ \{', src, re.M)
        if trailing:
            src = src[:trailing.start()]
        paths = [mm.group(1).split('::') for mm in re.finditer(r'crate::((?:[a-z_0-9]+::)*[a-z_0-9]+)', src)]
        for mm in re.finditer(r'use crate::\{([^;]*)\};', src, re.S):
            paths += [item.strip('{} ').split('::') for item in re.split(r'[,\s]+', mm.group(1)) if item.strip('{} ')]
        for path in paths:
            t = target(path)
            if t and t != m:
                edges[m].add(t)

# Tarjan's strongly connected components.
sys.setrecursionlimit(10000)
index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]


def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in edges[v]:
        if w not in index:
            visit(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        sccs.append(comp)


for v in sorted(names):
    if v not in index:
        visit(v)
cycles = sorted((sorted(s) for s in sccs if len(s) > 1), key=len, reverse=True)
print(f'modules: {len(names)}, edges: {sum(len(e) for e in edges.values())}')
for s in cycles:
    print(f'cycle ({len(s)}): {", ".join(s)}')
if not cycles:
    print('no cycle')
if '-v' in sys.argv:
    for m in sorted(edges):
        print(m, '->', ', '.join(sorted(edges[m])))
