"""Every ```python block of README.md and docs/*.md runs as written: each in a fresh interpreter,
in a directory where scripts/train.sh's run (runs/latest, here a tiny one on the test text) has
been made, so that what the docs show a user works when pasted. (```py marks a fragment naming
the reader's own objects — a Trainer's model and data —, which python/tests/test_stacks.py runs
in full.)

    docs_blocks.py MUON_CLI DATA_FILE REPO_ROOT WORK_DIR
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys


def blocks(path):
    """(line, code) of each ```python block of `path`."""
    text = path.read_text()
    for match in re.finditer(r"^```python\n(.*?)^```$", text, re.S | re.M):
        yield text.count("\n", 0, match.start()) + 1, match.group(1)


def main():
    muon, data, root, work = sys.argv[1:5]
    root, work = pathlib.Path(root), pathlib.Path(work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    subprocess.run([muon, "train", "--data", data, "--steps", "4", "--layers", "1",
                    "--d-model", "32", "--seq-len", "32", "--batch-size", "4",
                    "--out", "runs/latest"], cwd=work, check=True, stdout=subprocess.DEVNULL)
    ran = 0
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for line, code in blocks(path):
            where = f"{path.relative_to(root)}:{line}"
            done = subprocess.run([sys.executable, "-c", code], cwd=work, capture_output=True,
                                  text=True, timeout=300)
            assert done.returncode == 0, f"{where} fails as written:\n{done.stderr}"
            print(f"docs_blocks: {where} runs")
            ran += 1
    assert ran >= 4, f"only {ran} python blocks found"
    print(f"docs_blocks: all {ran} python blocks run: OK")


if __name__ == "__main__":
    main()
