"""docs/robustness.md stays true: every row names a test that exists, and that test's file asserts
part of the row's message (a string literal of it, regex escapes aside, is in the message or
holds it).

    check_catalogue.py REPO_ROOT
"""
import pathlib
import re
import sys


def literals(text):
    found = re.findall(r'"((?:[^"\\\n]|\\.)*)"', text) + re.findall(r"'((?:[^'\\\n]|\\.)*)'", text)
    return [plain(s) for s in found if len(plain(s)) >= 6]


def plain(s):
    return s.replace("\\", "")


def test_file(root, name):
    """The file that defines test `name`: GoogleTest, pytest or a CTest NAME."""
    if "." in name and name.split(".")[0][0].isupper():
        suite, case = name.split(".", 1)
        pattern, files = f"TEST({suite}, {case})", (root / "tests").glob("*.cpp")
    elif name.startswith("test_"):
        pattern, files = f"def {name}(", (root / "python" / "tests").glob("*.py")
    else:
        pattern, files = f"NAME {name}\n", [root / "tests" / "CMakeLists.txt"]
    # The CLI's usage-error tests are made by cli_usage_error(SHORT_NAME ...) as cli.SHORT_NAME.
    usage_error = (re.compile(r"cli_usage_error\(" + re.escape(name[len("cli."):]) + r"\s")
                   if name.startswith("cli.") else None)
    for path in files:
        text = path.read_text()
        if pattern in text or pattern.strip() + " " in text or (
                usage_error and usage_error.search(text)):
            return path
    return None


def main():
    root = pathlib.Path(sys.argv[1])
    rows = 0
    problems = []
    for line in (root / "docs" / "robustness.md").read_text().splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) != 3 or not re.fullmatch(r"`[^`]+`", cells[2]):
            continue
        rows += 1
        name = cells[2].strip("`")
        path = test_file(root, name)
        if path is None:
            problems.append(f"no test named {name}")
            continue
        # For a CTest entry the assertion may sit in a script it runs; search those too.
        scripts = [*(root / "tests").glob("*.sh"), *(root / "scripts").glob("*.sh")]
        text = path.read_text() + "".join(p.read_text() for p in scripts)
        messages = [plain(m.replace("\\|", "|").replace("⏎", "\n"))
                    for m in re.findall(r"`([^`]+)`", cells[1])]
        if not messages:
            continue  # a described outcome, not a message
        if not any(lit in m or m in lit for m in messages for lit in literals(text)):
            problems.append(f"{name} ({path.name}) asserts no part of {messages}")
    print(f"{rows} catalogued bad inputs")
    for p in problems:
        print("FAIL:", p)
    if rows < 60 or problems:
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
