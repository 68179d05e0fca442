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

