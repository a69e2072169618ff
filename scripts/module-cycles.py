#!/usr/bin/env python3
"""Import cycles between a crate's modules: `python3 scripts/module-cycles.py crates/agent/src [DEPTH] [-v]`.

A module is a file or directory under SRC, taken to DEPTH path components (1: top-level
modules, the default). An edge A -> B is any `crate::B...` path in A's non-test code, or any
`super::...` or `self::...` path that leads to B from A's file (comment lines, `*tests.rs`
files, `*_tests/` directories, modules declared `#[cfg(test)] mod NAME;` and a trailing
`#[cfg(test)] mod NAME {` and what follows it are skipped). Prints the strongly connected
components of more than one module (the cycles); -v lists every edge too.
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


def module_path(p):
    """The module path of file `p` (`a/b.rs` and `a/b/mod.rs`: ['a', 'b']; lib.rs: [])."""
    parts = os.path.relpath(p, root)[:-3].split('/')
    if parts[-1] == 'mod':
        parts = parts[:-1]
    return [] if parts in (['lib'], ['main']) else parts


def target(path):
    for k in range(len(path), 0, -1):
        cand = '::'.join(path[:k])
        if cand in names:
            return cand
    return None


# Files of modules declared under `#[cfg(test)]` (`#[cfg(test)] mod testkit;`), and all below
# them, are test code too.
test_dirs = []
for files in mods.values():
    for p in files:
        here = module_path(p)
        for mm in re.finditer(r'^#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))? )?mod ([a-z_0-9]+);', open(p).read(), re.M):
            test_dirs.append(os.path.join(root, *here, mm.group(1)))


def is_test_file(p):
    if p.endswith('tests.rs') or '_tests/' in p or '/tests/' in p:
        return True
    return any(p == d + '.rs' or p.startswith(d + '/') for d in test_dirs)


edges = {m: set() for m in names}
for m, files in mods.items():
    for p in files:
        if is_test_file(p):
            continue
        src = '\n'.join(line for line in open(p).read().split('\n') if not line.strip().startswith('//'))
        trailing = re.search(r'^#\[cfg\(test\)\]\nmod [a-z_0-9]+ \{', src, re.M)
        if trailing:
            src = src[:trailing.start()]
        paths = [mm.group(1).split('::') for mm in re.finditer(r'crate::((?:[a-z_0-9]+::)*[a-z_0-9]+)', src)]
        for mm in re.finditer(r'use crate::\{([^;]*)\};', src, re.S):
            paths += [item.strip('{} ').split('::') for item in re.split(r'[,\s]+', mm.group(1)) if item.strip('{} ')]
        # `super::` and `self::` paths, made absolute from the file's own module path.
        here = module_path(p)
        for mm in re.finditer(r'(?<![\w:])((?:super::)+|self::)((?:[a-z_0-9]+::)*[a-z_0-9]+|\{[^;]*?\})', src, re.S):
            prefix, rest = mm.group(1), mm.group(2)
            base = here if prefix == 'self::' else here[: len(here) - prefix.count('super::')]
            if prefix != 'self::' and len(here) < prefix.count('super::'):
                continue
            items = [rest] if not rest.startswith('{') else [i.strip('{} ') for i in re.split(r'[,\s]+', rest)]
            paths += [base + i.split('::') for i in items if i and i.strip('{} ') not in ('self', '*')]
            if rest.startswith('{') and 'self' in re.split(r'[,\s{}]+', rest):
                paths.append(base)
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
