#!/usr/bin/env python3
"""The option tables of docs/python.md and docs/config.md, generated from the C++ option schema
(include/muon/option_schema.h and the lists beside each options struct, read through
muon_cpp._core.option_schema and muon_cpp._core.config_schema).

    PYTHONPATH=build/python /usr/bin/python3 scripts/option_tables.py --write   # update the docs
    PYTHONPATH=build/python /usr/bin/python3 scripts/option_tables.py --check   # fail if stale

A table stands between the lines ``<!-- options: NAME [yaml] -->`` and ``<!-- end options -->``.
Without ``yaml``, NAME is a registered algorithm (muon, adamw, ...) and the defaults are Python
values, or ``presets``: the presets of the matrices' settings (muon_cpp._core.muon_presets) with what each sets; with ``yaml``, NAME is a config section (muon, adamw, optimizer, shorthand, schedule,
schedule.tail, momentum_schedule, param_group) and the defaults are written as YAML by the C++
config writer.
"""

import argparse
import pathlib
import re
import sys

import torch

from muon_cpp import _core

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "docs" / "python.md", ROOT / "docs" / "config.md", ROOT / "docs" / "algorithms.md"]
BLOCK = re.compile(r"(<!-- options: ([\w.]+)( yaml)? -->\n)(.*?)(<!-- end options -->)", re.S)


def python_text(value):
    if isinstance(value, torch.dtype):
        return str(value)
    return repr(value)


def python_table(algorithm):
    rows = ["| option | default | range | meaning |", "|---|---|---|---|"]
    for name, default, doc, rng in _core.option_schema(algorithm):
        rows.append(f"| `{name}` | `{python_text(default)}` | {rng} | {doc} |")
    return rows


def presets_table():
    rows = ["| preset | whose | algorithm | sets (the other options keep their defaults) |",
            "|---|---|---|---|"]
    for name, origin, algorithm, settings in _core.muon_presets():
        defaults = {key: default for key, default, _doc, _range in _core.option_schema(algorithm)}
        changed = ", ".join(f"`{key}={python_text(value)}`" for key, value in settings.items()
                            if value != defaults[key]) or "its defaults"
        rows.append(f"| `{name}` | {origin} | {algorithm} | {changed} |")
    return rows


def yaml_table(section):
    schema = _core.config_schema(section)
    if section == "shorthand":
        rows = ["| key | sets |", "|---|---|"]
        for key, alias, _, doc, _, _ in schema:
            also = f" (also `{alias}`)" if alias else ""
            rows.append(f"| `{key}`{also} | {doc.removeprefix('sets ')} |")
        return rows
    kinds_column = any(kinds for *_, kinds in schema)
    head = "| key | default | range | meaning |" + (" schedules |" if kinds_column else "")
    rows = [head, "|---|---|---|---|" + ("---|" if kinds_column else "")]
    for key, alias, default, doc, rng, kinds in schema:
        also = f" (also `{alias}`)" if alias else ""
        # A key a section cannot go without has no default, whatever its C++ field starts at.
        shown = "none: required" if doc.endswith("(required)") else f"`{default}`"
        row = f"| `{key}`{also} | {shown} | {rng} | {doc} |"
        if kinds_column:
            row += f" {', '.join(kinds.split()) or 'all'} |"
        rows.append(row)
    return rows


def table(name, yaml):
    rows = (yaml_table(name) if yaml else presets_table() if name == "presets"
            else python_table(name))
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
