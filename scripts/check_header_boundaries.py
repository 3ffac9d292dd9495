#!/usr/bin/env python3
"""Checks that no library of src/ reaches into another's private headers.

Each library declares, in its CMakeLists.txt, the headers other libraries may
include (erun_exports(TARGET FOLDER HEADER...)); configuring writes them and
every library's link dependencies to BUILD/header_boundaries.txt, one line per
library: target|folder|exported headers (;-separated)|linked targets. This
script reads that file and every source of src/<folder>/ and reports each
`#include "<other>/<path>"` where <other> is another library's folder and
<path> is not among its exports, or where the including library does not link
that library (directly or through its dependencies). Exit 0: no such include.

  check_header_boundaries.py BUILD/header_boundaries.txt SRC_DIR
  check_header_boundaries.py --self-test
"""
import os
import re
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/([^"]+)"', re.M)


def read_table(path):
    libs = {}
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            target, folder, exports, deps = line.split("|")
            clean = lambda s: [x for x in s.split(";") if x and not x.endswith("-NOTFOUND")]
            libs[target] = {"folder": folder, "exports": set(clean(exports)), "deps": clean(deps)}
    return libs


def closure(libs, target):
    seen, todo = set(), [target]
    while todo:
        t = todo.pop()
        for d in libs.get(t, {}).get("deps", []):
            if d in libs and d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


def violations(libs, src):
    by_folder = {v["folder"]: t for t, v in libs.items()}
    out = []
    for target, lib in sorted(libs.items()):
        reachable = closure(libs, target)
        root = os.path.join(src, lib["folder"])
        for dirpath, _, files in os.walk(root):
            for name in sorted(files):
                if not name.endswith((".h", ".cc")):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, errors="replace") as f:
                    text = f.read()
                for folder, header in INCLUDE.findall(text):
                    other = by_folder.get(folder)
                    if other is None or other == target:
                        continue
                    rel = os.path.relpath(path, src)
                    if other not in reachable:
                        out.append(f"{rel}: includes {folder}/{header} but {target} does not link {other}")
                    elif header not in libs[other]["exports"]:
                        out.append(f"{rel}: includes {folder}/{header}, a private header of {other} "
                                   f"(its exports: {', '.join(sorted(libs[other]['exports'])) or 'none'})")
    return out


def self_test():
    with tempfile.TemporaryDirectory() as d:
        def put(rel, text):
            os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
            with open(os.path.join(d, rel), "w") as f:
                f.write(text)
        put("src/a/pub.h", "")
        put("src/a/priv.h", "")
        put("src/b/ok.cc", '#include "a/pub.h"\n#include "b/own.h"\n#include "erun/x.hpp"\n')
        put("src/b/bad.cc", '#include "a/priv.h"\n')
        put("src/c/unlinked.cc", '#include "a/pub.h"\n')
        put("table.txt", "erun_a|a|pub.h|\nerun_b|b||erun_a\nerun_c|c||\n")
        got = violations(read_table(os.path.join(d, "table.txt")), os.path.join(d, "src"))
        want = ["b/bad.cc: includes a/priv.h, a private header of erun_a (its exports: pub.h)",
                "c/unlinked.cc: includes a/pub.h but erun_c does not link erun_a"]
        if got != want:
            print("self-test failed:\n  got  " + "\n       ".join(got) + "\n  want " + "\n       ".join(want))
            return 1
    print("self-test passed")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) != 3:
        print(__doc__)
        return 2
    libs = read_table(argv[1])
    bad = violations(libs, argv[2])
    for v in bad:
        print(v)
    print(f"{len(libs)} libraries checked, {len(bad)} private includes across libraries")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
