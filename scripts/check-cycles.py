#!/usr/bin/env python3
"""Fails when the source files of a crate import each other in a circle.

Usage: scripts/check-cycles.py CRATE_DIR...

A file imports another when it names an item of that file's module: `use crate::a::b`,
`use super::x`, `crate::a::f()` in code, `pub use child::X`, and in a `mod.rs` (or the root)
`child::Item` in code, where `child` is a child module. The crate root (`lib.rs`) is no
node of the graph (it declares every module and re-exports some), but its re-exports are seen
through: `crate::X`, where the root has `pub use a::b::X` (or `pub use a::b::Y as X`), is an
import of the file of `a::b`, the module the re-export names. A module's own `mod child;` is
not an import of the child. Test modules (`#[cfg(test)] mod tests` and what follows it in a file),
comments and strings are ignored. Prints every circle found (as a path of files) and exits 1
if there is one.
"""

import re
import sys
from pathlib import Path

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def module_files(src: Path) -> dict:
    """Module path (tuple) -> file, for every .rs file under src (lib.rs is ())."""
    modules = {}
    for f in src.rglob("*.rs"):
        rel = f.relative_to(src).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] in ("mod", "lib", "main"):
            parts = parts[:-1]
        modules[tuple(parts)] = f
    return modules


def strip(text: str) -> str:
    """The code without its test module, comments and string literals."""
    text = re.split(r"#\[cfg\(test\)\]\s*(?:#\[path = [^\]]*\]\s*)?mod tests", text)[0]
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r'"(\\.|[^"\\])*"', '""', text)


def expand_use(tree: str) -> list:
    """`a::{b, c::{d, e}}` -> ["a::b", "a::c::d", "a::c::e"] (a use tree, roughly)."""
    tree = tree.strip()
    m = re.match(r"^(.*?)\{(.*)\}$", tree, flags=re.S)
    if not m:
        return [tree]
    prefix, inner = m.group(1), m.group(2)
    items, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    items.append(cur)
    out = []
    for item in items:
        if item.strip():
            out += [prefix + p for p in expand_use(item)]
    return out


def paths_in(code: str) -> list:
    """Every module path the code names: use trees and paths in expressions."""
    found = []
    for m in re.finditer(r"\buse\s+([^;]+);", code):
        found += [p.strip() for p in expand_use(m.group(1))]
    code = re.sub(r"\buse\s+[^;]+;", "", code)
    found += re.findall(rf"\b(?:crate|super|self)(?:::{IDENT})+", code)
    # `child::Item` in code: resolved (in a mod.rs or the root) only when `child` is a child
    # module, as a use tree's first segment is.
    found += re.findall(rf"(?<![:\w])(?!crate\b|super\b|self\b){IDENT}(?:::{IDENT})+", code)
    return found


def deepest_module(base: tuple, parts: list, modules: dict) -> tuple:
    """`base` and the longest prefix of `parts` below it that is a module of the crate."""
    target = base
    for p in parts:
        if target + (p,) not in modules:
            break
        target = target + (p,)
    return target


def root_reexports(src: Path, modules: dict) -> dict:
    """Item name -> the module named, for the crate root's `pub use a::b::Item` (and
    `pub use a::b::Item as Name`); re-exports of other crates' items are left out."""
    out = {}
    for m in re.finditer(r"\bpub\s+use\s+([^;]+);", strip((src / "lib.rs").read_text())):
        for p in expand_use(m.group(1)):
            path, _, alias = (x.strip() for x in p.partition(" as "))
            parts = [x.strip() for x in path.split("::") if x.strip()]
            if parts and parts[0] == "crate":
                parts = parts[1:]
            target = deepest_module((), parts[:-1], modules)
            if target and parts:
                out[alias or parts[-1]] = target
    return out


def resolve(path: str, here: tuple, is_mod_file: bool, modules: dict, reexports: dict):
    """The module a path names, relative to module `here` (None: outside the crate);
    `reexports` is what `root_reexports` found."""
    parts = [p.strip() for p in path.split("::") if p.strip()]
    if not parts:
        return None
    base = list(here)
    if parts[0] == "crate" and len(parts) > 1 and (parts[1],) not in modules:
        # `crate::X`: through the root's re-export of X to the module X lives in.
        if parts[1] in reexports:
            return reexports[parts[1]]
    if parts[0] == "crate":
        base, parts = [], parts[1:]
    elif parts[0] in ("super", "self"):
        while parts and parts[0] in ("super", "self"):
            if parts[0] == "super":
                base = base[:-1]
            parts = parts[1:]
    elif is_mod_file or here == ():
        # `use child::x` from a mod.rs (or the root): a child module.
        if tuple(base + [parts[0]]) not in modules:
            return None
    else:
        return None
    return deepest_module(tuple(base), parts, modules)


def cycles(crate: Path) -> list:
    src = crate / "src"
    modules = module_files(src)
    reexports = root_reexports(src, modules)
    graph = {m: set() for m in modules}
    for here, f in modules.items():
        if here == ():
            continue
        is_mod = f.name == "mod.rs"
        for path in paths_in(strip(f.read_text())):
            target = resolve(path, here, is_mod, modules, reexports)
            if target is None or target == () or target == here:
                continue
            graph[here].add(target)
    graph.pop((), None)
    found, state, stack = [], {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                found.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    names = {m: str(f.relative_to(crate)) for m, f in modules.items()}
    return [[names[m] for m in c] for c in found]


def main() -> int:
    bad = 0
    for arg in sys.argv[1:]:
        for c in cycles(Path(arg)):
            bad += 1
            print(f"{arg}: import circle: " + " -> ".join(c))
    if bad:
        print(f"{bad} circle(s) of imports")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
