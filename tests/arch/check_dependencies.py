#!/usr/bin/env python3
"""The dependency rule of ARCHITECTURE.md, checked against the code.

ARCHITECTURE.md's fenced block lists, for each folder under src/, the folders it may use
("doctor -> containerd, runtime, ..."; "nri/status" names one library of a folder). Every folder
may use what those reach in turn, and common. This checks two things against that closure:
  - each `#include "<folder>/..."` in src/<folder>/ (generated protobuf headers, *.pb.h, count as
    `proto`);
  - each gpufence_* library in the target_link_libraries of src/<folder>/CMakeLists.txt.
Exit 0 when both hold; otherwise each violation is printed and the exit status is 1.
Usage: check_dependencies.py SOURCE_DIR
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
text = (root / "ARCHITECTURE.md").read_text()
block = re.search(r"one way.*?```\n(.*?)```", text, re.S)
if not block:
    sys.exit("ARCHITECTURE.md: no dependency block after 'Dependencies point one way'")

allowed: dict[str, set[str]] = {}
for line in block.group(1).splitlines():
    line = re.sub(r"\(.*?\)", "", line)  # remarks in parentheses
    for m in re.finditer(r"([a-z/]+) → ([a-z/, ]+?)(?=\s{2,}|\s*$)", line):
        allowed.setdefault(m.group(1), set()).update(
            d.strip() for d in m.group(2).split(",") if d.strip())
if not allowed:
    sys.exit("ARCHITECTURE.md: the dependency block names no dependency")


def closure(folder: str) -> set[str]:
    seen, todo = set(), [folder]
    while todo:
        f = todo.pop()
        for d in allowed.get(f, ()):
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen | {"common"}


folders = sorted(p.name for p in (root / "src").iterdir() if p.is_dir())
lib_folder = {f"gpufence_{f}": f for f in folders}
lib_folder.update({"gpufence_proto": "proto", "gpufence_nri_proto": "proto",
                   "gpufence_nri_status": "nri/status"})
external = {"gpufence_settings", "gpufence_yaml"}  # compile settings; yaml-cpp's target
errors = []
for folder in folders:
    may = closure(folder)
    if folder != "cli" and folder not in allowed and folder not in ("common",):
        errors.append(f"src/{folder}/ is not in ARCHITECTURE.md's dependency block")
    for src in sorted((root / "src" / folder).glob("*.[ch]pp")):
        for n, line in enumerate(src.read_text().splitlines(), 1):
            m = re.match(r'\s*#\s*include\s+"([a-z_]+)/([^"]+)"', line)
            if not m:
                continue
            used, rest = m.group(1), m.group(2)
            if rest.endswith(".pb.h"):
                used = "proto"
            elif used == "nri" and rest == "status.hpp" and folder != "nri":
                used = "nri/status"
            if used == folder or used in may:
                continue
            errors.append(f"{src.relative_to(root)}:{n}: includes {m.group(1)}/{rest}; "
                          f"{folder} may use only {', '.join(sorted(may))} (ARCHITECTURE.md)")
    cmake = root / "src" / folder / "CMakeLists.txt"
    for m in re.finditer(r"target_link_libraries\((\S+)\s+(?:PUBLIC|PRIVATE|INTERFACE)\s+([^)]*)\)",
                         cmake.read_text()):
        target = m.group(1)
        own = "nri/status" if target == "gpufence_nri_status" else folder
        for lib in m.group(2).split():
            if not lib.startswith("gpufence_") or lib in external:
                continue
            used = lib_folder.get(lib)
            if used is None:
                errors.append(f"{cmake.relative_to(root)}: {target} links {lib}, a library "
                              "ARCHITECTURE.md does not place")
            elif used.split("/")[0] != folder and used not in closure(own):
                errors.append(f"{cmake.relative_to(root)}: {target} links {lib} ({used}); "
                              f"{own} may use only {', '.join(sorted(closure(own)))}")

for e in errors:
    print(e)
print(f"{len(folders)} folders, {sum(len(v) for v in allowed.values())} declared dependencies: "
      f"{'OK' if not errors else str(len(errors)) + ' violation(s)'}")
sys.exit(1 if errors else 0)
