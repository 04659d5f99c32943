#!/usr/bin/env python3
"""Holds the real #include graph against the library table of docs/architecture.md.

Each library's files are its CMake SOURCES (ts_library in the CMakeLists files) and the headers
beside them; a header-only file belongs to its folder's lowest library. Every project #include in
a library's files must name a file of the same library or of one the table lists for it (its
row with the parentheses dropped, up to the first ';'). Generated Protobuf/gRPC headers and
proto/ are ts_proto. Executables and tests are leaves and are not checked.

  python3 scripts/check_layers.py        # exit 1 and one line per violation, else a summary
"""

import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
# Folders whose header-only files belong to this library (its lowest one there).
FOLDER_DEFAULT = {"worker": "ts_worker_format", "proto": "ts_proto"}
# The libraries the table folds into another's row.
FOLDED = {"ts_grpc_status": "ts_proto"}


def table():
    text = open(os.path.join(ROOT, "docs", "architecture.md")).read()
    rows = re.findall(r"^\| `(ts_\w+)` \| (.*) \|$", text, re.M)
    if not rows:
        sys.exit("check_layers: no library table in docs/architecture.md")
    libs = [name for name, _ in rows]

    def short(lib):
        return re.sub(r"^ts_(sidecar_|bridge_)?", "", lib)

    by_short = {short(lib): lib for lib in libs}
    allowed = {}
    for name, deps in rows:
        while True:
            dropped = re.sub(r"\([^()]*\)", "", deps)
            if dropped == deps:
                break
            deps = dropped
        deps = deps.split(";")[0]
        allowed[name] = set()
        for token in deps.split(","):
            words = token.strip().split()
            if words and words[0] in by_short:
                allowed[name].add(by_short[words[0]])
    return libs, allowed


def cmake_libraries():
    """{path of a source or header: library} from every ts_library(...) call."""
    owner = {}
    for folder, _, files in os.walk(ROOT):
        rel = os.path.relpath(folder, ROOT)
        if rel.startswith(("build", ".git", "tests")) or "CMakeLists.txt" not in files:
            continue
        text = open(os.path.join(folder, "CMakeLists.txt")).read()
        text = "\n".join(line.split("#")[0] for line in text.splitlines())
        for m in re.finditer(r"ts_library\(\s*(\w+)(.*?)\)", text, re.S):
            name = FOLDED.get(m.group(1), m.group(1))
            body = m.group(2)
            sources = re.search(r"SOURCES(.*?)(DEPS|PRIVATE_DEPS|$)", body, re.S)
            for src in (sources.group(1).split() if sources else []):
                path = os.path.normpath(os.path.join(rel, src))
                owner[path] = name
                header = os.path.splitext(path)[0] + ".h"
                if os.path.exists(os.path.join(ROOT, header)):
                    owner.setdefault(header, name)
    return owner


PROJECT_FOLDERS = ("common/", "state/", "chain-bridge/", "sidecar/", "worker/", "proto/")


def lib_of(include, owner):
    if include.startswith(("gonka/", "cosmos/", "tendermint/")) or include.startswith("proto/"):
        return "ts_proto"
    if include in owner:
        return owner[include]
    folder = os.path.dirname(include)
    if folder in FOLDER_DEFAULT:
        return FOLDER_DEFAULT[folder]
    # A header-only file: its folder's library (the one owning its other files).
    libs = {lib for path, lib in owner.items() if os.path.dirname(path) == folder}
    return libs.pop() if len(libs) == 1 else None


def main():
    libs, allowed = table()
    owner = cmake_libraries()
    missing = sorted(set(owner.values()) - set(libs) - {"ts_test_link", "ts_bench_training"})
    problems = [f"docs/architecture.md: no row for {lib}" for lib in missing]
    checked = 0
    for path, lib in sorted(owner.items()):
        if lib not in allowed:
            continue
        full = os.path.join(ROOT, path)
        if not os.path.exists(full):
            continue
        checked += 1
        for n, line in enumerate(open(full, errors="replace"), start=1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if not m:
                continue
            if not m.group(1).startswith(PROJECT_FOLDERS + ("gonka/", "cosmos/", "tendermint/")):
                continue  # a library from outside the project (Abseil, Protobuf, ...)
            target = lib_of(m.group(1), owner)
            if target is None:
                problems.append(f"{path}:{n}: includes {m.group(1)}, which no library owns")
            elif target != lib and target not in allowed[lib]:
                problems.append(f"{path}:{n}: {lib} includes {m.group(1)} ({target}), which "
                                f"docs/architecture.md does not list for {lib}")
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"check_layers: {checked} files of {len(allowed)} libraries include only what "
          f"docs/architecture.md allows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
