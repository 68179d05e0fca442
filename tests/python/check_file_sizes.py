"""The 400-line rule of docs/design.md §Sizes of files: every tracked file of the project's code
over 400 lines says why in its opening lines ("Over 400 lines on purpose: ..."). Prints each file
over the limit with its reason, then "file sizes: OK"; exits 1 naming the files without one.

    check_file_sizes.py REPOSITORY
"""
import subprocess
import sys
from pathlib import Path

LIMIT = 400
CODE = ("src/", "include/", "tools/", "bench/", "fuzz/", "scripts/", "examples/", "python/")
EXEMPT = ("python/tests/",)
SUFFIXES = (".cpp", ".h", ".py", ".sh", ".cmake")
MARK = "Over 400 lines on purpose:"
OPENING = 15  # lines in which the reason must stand


def main():
    repo = Path(sys.argv[1])
    files = subprocess.run(["git", "-C", str(repo), "ls-files", *CODE], check=True,
                           capture_output=True, text=True).stdout.split()
    missing = []
    for name in files:
        if name.startswith(EXEMPT) or not name.endswith(SUFFIXES):
            continue
        lines = (repo / name).read_text(encoding="utf-8").splitlines()
        if len(lines) <= LIMIT:
            continue
        opening = " ".join(line.strip(" /#*\"") for line in lines[:OPENING])
        if MARK in opening:
            print(f"{name}: {len(lines)} lines; {opening[opening.index(MARK):][:100]}...")
        else:
            missing.append(f"{name} ({len(lines)} lines)")
    if missing:
        sys.exit(f"over {LIMIT} lines without '{MARK} <why>' in the first {OPENING} lines "
                 f"(docs/design.md §Sizes of files): " + ", ".join(missing))
    print("file sizes: OK")


if __name__ == "__main__":
    main()
