"""The Python example trains and reduces its test loss (it exits non-zero otherwise)."""
import pathlib
import subprocess
import sys

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "train_mlp.py"


def test_train_mlp_example_learns():
    result = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "120"],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "hidden.0.weight" in result.stdout and "muon" in result.stdout
    assert "test loss" in result.stdout and "checkpoint:" in result.stdout


DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
# The stacks' own packages (transformers, lightning, accelerate): their blocks run in
# test_stacks.py, where they are installed.
STACKS = ("transformers", "lightning", "accelerate", "torchtune")


def python_blocks(path):
    text = path.read_text(encoding="utf-8")
    return [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]


def test_the_python_blocks_of_docs_python_md_run():
    blocks = [b for b in python_blocks(DOCS / "python.md") if not any(
        f"import {stack}" in b or f"from {stack}" in b for stack in STACKS)]
    assert len(blocks) >= 3
    for block in blocks:
        exec(compile(block, "docs/python.md", "exec"), {})  # each block stands alone
