#!/usr/bin/env python3
"""The option tables of docs/python.md and docs/config.md, generated from the C++ option schema
(include/muon/option_schema.h, read through muon_cpp._core.option_schema).

    PYTHONPATH=build/python /usr/bin/python3 scripts/option_tables.py --write   # update the docs
    PYTHONPATH=build/python /usr/bin/python3 scripts/option_tables.py --check   # fail if stale

A table stands between the lines ``<!-- options: ALGORITHM [yaml] -->`` and
``<!-- end options -->``; ``yaml`` writes the defaults as a YAML config spells them.
"""

import argparse
import pathlib
import re
import sys

import torch

from muon_cpp import _core

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "docs" / "python.md", ROOT / "docs" / "config.md"]
BLOCK = re.compile(r"(<!-- options: (\w+)( yaml)? -->\n)(.*?)(<!-- end options -->)", re.S)
YAML_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float64: "float64"}


def python_text(value):
    if isinstance(value, torch.dtype):
        return str(value)
    return repr(value)


def yaml_text(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, torch.dtype):
        return YAML_DTYPES[value]
    if isinstance(value, tuple):
        return "[" + ", ".join(yaml_text(v) for v in value) + "]"
    return str(value)


def table(algorithm, yaml):
    text = yaml_text if yaml else python_text
    rows = ["| option | default | range | meaning |", "|---|---|---|---|"]
    for name, default, doc, rng in _core.option_schema(algorithm):
        rows.append(f"| `{name}` | `{text(default)}` | {rng} | {doc} |")
    return "\n".join(rows) + "\n"


def regenerate(text):
    return BLOCK.sub(lambda m: m.group(1) + table(m.group(2), bool(m.group(3))) + m.group(5),
                     text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="fail when a table is stale")
    mode.add_argument("--write", action="store_true", help="rewrite the tables in place")
    args = parser.parse_args()
    stale = []
    for path in DOCS:
        text = path.read_text()
        if not BLOCK.search(text):
            sys.exit(f"{path}: no <!-- options: ... --> table")
        fresh = regenerate(text)
        if fresh != text:
            stale.append(path)
            if args.write:
                path.write_text(fresh)
    if args.check and stale:
        names = ", ".join(str(p.relative_to(ROOT)) for p in stale)
        sys.exit(f"stale option tables in {names}: run scripts/option_tables.py --write")
    print("option tables: " + ("rewritten" if args.write and stale else "up to date"))


if __name__ == "__main__":
    main()
