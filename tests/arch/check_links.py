#!/usr/bin/env python3
"""Every relative link in README.md, ARCHITECTURE.md and docs/*.md names a file that exists and,
for a `#fragment` into a Markdown file, one of its headings (GitHub's anchor: lower case,
punctuation dropped, spaces as hyphens). The README points to docs/ for what it does not say
itself, so a moved or renamed page must not leave it pointing nowhere.
Exit 0 when all resolve; otherwise each broken link is printed and the exit status is 1.
Usage: check_links.py SOURCE_DIR
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
files = [root / "README.md", root / "ARCHITECTURE.md", *sorted((root / "docs").glob("*.md"))]


def prose(path: pathlib.Path) -> str:
    return re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # code blocks hold no links


def anchors(path: pathlib.Path) -> set[str]:
    return {re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            for m in re.finditer(r"^#+\s+(.*)$", prose(path), re.M)}


errors = []
for f in files:
    for m in re.finditer(r"\]\(([^)\s]+)\)", prose(f)):
        link = m.group(1)
        if re.match(r"[a-z]+:", link):  # https:, mailto:
            continue
        path, _, frag = link.partition("#")
        target = (f.parent / path) if path else f
        if not target.exists():
            errors.append(f"{f.relative_to(root)}: ({link}): no such file")
        elif frag and target.suffix == ".md" and frag not in anchors(target):
            errors.append(f"{f.relative_to(root)}: ({link}): {target.name} has no such heading")
for e in errors:
    print(e)
sys.exit(1 if errors else 0)
