"""The examples of docs/python.md marked to run (an HTML comment naming this file above the code
block) run as written, each in a fresh interpreter, and finish without error."""
import pathlib
import re
import subprocess
import sys

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"
MARK = "<!-- runs in python/tests/test_docs_examples.py -->"


def examples():
    text = DOC.read_text()
    blocks = re.findall(re.escape(MARK) + r"\s*```py\n(.*?)```", text, flags=re.S)
    assert len(blocks) == text.count(MARK), "a mark not followed by a ```py block"
    return blocks


def test_the_docs_have_examples_to_run():
    assert examples()


@pytest.mark.parametrize("code", examples(), ids=lambda code: code.splitlines()[-1][:40])
def test_example_runs(code):
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=600, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
