#!/usr/bin/env python3
"""Prints the import cycles between the modules of each crate in the workspace.

A module `a` depends on `b` when `a`'s file names `crate::b` (or `super::b` at the top
level). The cycles are the strongly connected components with more than one module
(Tarjan's algorithm). Exits 1 when any crate has one, so CI can keep them gone.

    scripts/module-cycles.py [CRATE_DIR ...]   (default: every crate with a src/lib.rs)
"""
import pathlib
import re
import sys


def modules(src):
    """Top-level module name -> the text of its files (mod.rs and children included)."""
    mods = {}
    for path in sorted(src.rglob("*.rs")):
        rel = path.relative_to(src)
        if rel.parts[0] in ("lib.rs", "main.rs", "bin"):
            continue
        name = rel.parts[0].removesuffix(".rs")
        mods[name] = mods.get(name, "") + path.read_text(errors="replace")
    return mods


def graph(mods):
    names = set(mods)
    edges = {}
    for name, text in mods.items():
        # Comments are not imports.
        text = re.sub(r"//[^\n]*", "", text)
        used = set(re.findall(r"\bcrate::([a-z_][a-z0-9_]*)", text))
        for group in re.findall(r"\bcrate::\{([^}]*)\}", text):
            used.update(re.findall(r"\b([a-z_][a-z0-9_]*)\b", group))
        edges[name] = sorted((used & names) - {name})
    return edges


def cycles(edges):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

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
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    dirs = [pathlib.Path(a) for a in sys.argv[1:]] or sorted(
        p.parent.parent for p in root.glob("**/src/lib.rs") if "target" not in p.parts
    )
    found = False
    for d in dirs:
        comps = cycles(graph(modules(d / "src")))
        for comp in comps:
            found = True
            print(f"{d.relative_to(root) if d.is_absolute() else d}: cycle of {len(comp)} modules: {' '.join(comp)}")
    if not found:
        print(f"no import cycles in {len(dirs)} crates")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
