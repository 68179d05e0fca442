"""The import graph of the muon_cpp package: which of its modules imports which, and any circle.

    python3 scripts/import_graph.py [package directory]   (default: python/muon_cpp)

Reads the modules' source (nothing is imported): every `from . import x`, `from .x import y` and
`import muon_cpp.x`, at the top of a module or deferred inside a function alike — a deferred
import hides a circle from the interpreter, not from a reader. Prints each module's imports and
the circles; exits 1 when there is one.
"""
import ast
import pathlib
import sys


def package_imports(path, package):
    """The package's modules that the module at `path` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif node.level == 1:
                found.update(alias.name for alias in node.names)
            elif node.module and node.module.startswith(package + "."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[1] for alias in node.names
                         if alias.name.startswith(package + "."))
    return found


def graph(directory):
    modules = {p.stem: p for p in sorted(directory.glob("*.py"))}
    return {name: sorted(package_imports(path, directory.name) & set(modules) - {name})
            for name, path in modules.items()}


def circles(edges):
    """Every elementary circle, once, each starting at its smallest module name."""
    found = []

    def walk(start, node, path):
        for nxt in edges.get(node, ()):
            if nxt == start:
                found.append(path + [start])
            elif nxt > start and nxt not in path:
                walk(start, nxt, path + [nxt])

    for start in sorted(edges):
        walk(start, start, [start])
    return found


def main():
    directory = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "python/muon_cpp")
    edges = graph(directory)
    for name, imports in edges.items():
        print(f"{name}: {', '.join(imports) or '-'}")
    found = circles(edges)
    for circle in found:
        print("circle: " + " -> ".join(circle))
    print(f"{len(found)} import circle(s) in {directory}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
