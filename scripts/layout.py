#!/usr/bin/env python3
"""Layout check for the workspace: import circles between files and file sizes.

For every crate (a directory with Cargo.toml and src/), each source file is a
module; an edge A -> B means file A names an item of module B through a path
(`crate::x::y`, `super::z`, `self::w`, or a sibling module by its bare name
after a `use`). Strongly connected components of more than one file are import
circles. A module's own `mod child;` declaration is not an edge, nor is a path
into the file's own inline test module. Code under `#[cfg(test)]` is counted
too: tests are files like any other.

Non-test files (outside tests/ and not named tests.rs or *_tests.rs) longer
than the limit are reported.

Exit status 1 when a circle or an oversized file is found, so CI can run it.
Usage: scripts/layout.py [--max-lines N] [--verbose]
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 1200


def crates():
    for name in sorted(os.listdir(ROOT)):
        d = os.path.join(ROOT, name)
        if os.path.isfile(os.path.join(d, "Cargo.toml")) and os.path.isdir(os.path.join(d, "src")):
            yield name, d


def module_files(src):
    """Map module path tuples (relative to the crate root) to files."""
    mods = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            full = os.path.join(dirpath, f)
            rel = os.path.relpath(full, src)
            parts = rel[:-3].split(os.sep)
            if parts[0] == "bin":
                continue  # binaries are their own crate roots
            if parts[-1] in ("lib", "main") and len(parts) == 1:
                parts = []
            elif parts[-1] == "mod":
                parts = parts[:-1]
            mods[tuple(parts)] = full
    return mods


PATH_RE = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_RE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.M | re.S)
COMMENT_RE = re.compile(r"//[^\n]*")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = COMMENT_RE.sub("", text)
    # `pub(in crate::x)` is a visibility, not a use of `x`.
    return re.sub(r"pub\(in\s+[^)]*\)", "pub", text)


def inline_mod_spans(text):
    """Spans of inline `mod name { ... }` blocks: inside them `super`
    names the file's own module."""
    spans = []
    for m in re.finditer(r"\bmod\s+\w+\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
            i += 1
        spans.append((m.start(), i))
    return spans


def resolve(mods, base, segs):
    """Longest module prefix of base+segs that is a file."""
    path = tuple(base) + tuple(segs)
    for n in range(len(path), -1, -1):
        if path[:n] in mods:
            return path[:n]
    return None


def expand_use(tree):
    """Expand a use tree `a::{b, c::{d}}` into lists of segments."""
    tree = re.sub(r"\s+", "", tree)
    out = []

    def rec(prefix, t):
        if "{" not in t:
            for item in split_top(t):
                item = item.split(" as ")[0]
                out.append(prefix + [s for s in item.split("::") if s])
            return
        for item in split_top(t):
            if "{" in item:
                head, rest = item.split("{", 1)
                rest = rest[: rest.rfind("}")]
                rec(prefix + [s for s in head.split("::") if s], rest)
            else:
                rec(prefix, item)

    rec([], tree)
    return out


def split_top(t):
    depth, cur, parts = 0, "", []
    for ch in t:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        parts.append(cur)
    return parts


def reexports(mods):
    """Names a module re-exports with `pub use`, mapped to the module that
    defines them, so a path through a facade counts as a path to the file
    that holds the item."""
    out = {}
    for mod, file in mods.items():
        text = strip_comments(open(file, encoding="utf-8").read())
        for u in re.finditer(r"^\s*pub(?:\([^)]*\))?\s+use\s+([^;]+);", text, re.M | re.S):
            for segs in expand_use(u.group(1)):
                if not segs:
                    continue
                name = segs[-1]
                alias = re.search(r"\bas\s+(\w+)", u.group(1))
                if segs[0] == "crate":
                    base, rest = [], segs[1:]
                elif segs[0] == "super":
                    base, rest = list(mod[:-1]), segs[1:]
                elif segs[0] == "self":
                    base, rest = list(mod), segs[1:]
                else:
                    base, rest = list(mod), segs
                t = resolve(mods, base, rest[:-1]) if rest else None
                if t is not None and t != mod:
                    out[(mod, name)] = t
    return out


REEXPORTS = {}


def edges_of(mods, mod, file):
    text = strip_comments(open(file, encoding="utf-8").read())
    # `self` inside a file names that file's module; `super` its parent.
    here = list(mod)
    parent = here[:-1]
    targets = set()

    def add(base, segs):
        t = resolve(mods, base, segs)
        if t is None:
            return
        rest = list(tuple(base) + tuple(segs))[len(t):]
        if rest and (t, rest[0]) in REEXPORTS:
            t = REEXPORTS[(t, rest[0])]
        if t != mod:
            targets.add(t)

    spans = inline_mod_spans(text)

    def inside(pos):
        return any(a <= pos < b for a, b in spans)

    for m in PATH_RE.finditer(text):
        kw, rest = m.group(1), [s for s in m.group(2).split("::") if s]
        if kw == "super" and inside(m.start()):
            kw, rest = "self", rest
        # a use tree `crate::{a, b}` is handled below
        if kw == "crate":
            add([], rest)
        elif kw == "super":
            base = parent
            while rest and rest[0] == "super":
                base = base[:-1]
                rest = rest[1:]
            add(base, rest)
        else:
            add(here, rest)
    for u in USE_RE.finditer(text):
        nested = inside(u.start())
        for segs in expand_use(u.group(1)):
            if not segs:
                continue
            if nested and segs[0] == "super":
                segs = ["self"] + segs[1:]
            head = segs[0]
            if head == "crate":
                add([], segs[1:])
            elif head == "super":
                base, rest = parent, segs[1:]
                while rest and rest[0] == "super":
                    base, rest = base[:-1], rest[1:]
                add(base, rest)
            elif head == "self":
                add(here, segs[1:])
            elif tuple(here + [head]) in mods:
                add(here, segs)
    # A directory module declaring its children is structure, not an import,
    # but a `use child::x` from it is an import and stays.
    return targets


def sccs(graph):
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def is_test_file(path):
    base = os.path.basename(path)
    return f"{os.sep}tests{os.sep}" in path or base == "tests.rs" or base.endswith("_tests.rs")


def main():
    max_lines = MAX_LINES
    verbose = "--verbose" in sys.argv
    if "--max-lines" in sys.argv:
        max_lines = int(sys.argv[sys.argv.index("--max-lines") + 1])
    bad = 0
    for name, d in crates():
        mods = module_files(os.path.join(d, "src"))
        REEXPORTS.clear()
        REEXPORTS.update(reexports(mods))
        graph = {m: edges_of(mods, m, f) for m, f in mods.items()}
        for comp in sccs(graph):
            if len(comp) > 1:
                bad += 1
                files = sorted(os.path.relpath(mods[m], ROOT) for m in comp)
                print(f"circle in {name}: " + " <-> ".join(files))
                if verbose:
                    for m in comp:
                        for t in sorted(graph[m]):
                            if t in comp:
                                print(f"    {os.path.relpath(mods[m], ROOT)} -> {os.path.relpath(mods[t], ROOT)}")
        for dirpath, _, files in os.walk(d):
            if "target" in dirpath:
                continue
            for f in files:
                p = os.path.join(dirpath, f)
                if f.endswith(".rs") and not is_test_file(p):
                    n = sum(1 for _ in open(p, encoding="utf-8"))
                    if n > max_lines:
                        bad += 1
                        print(f"too long: {os.path.relpath(p, ROOT)} has {n} lines (limit {max_lines})")
    if bad:
        print(f"layout: {bad} problem(s)")
        return 1
    print("layout: no import circles, no file over the limit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
