"""A skip is a skip only where the test says what it needs (python/tests/needs.py): any other
skip — a bare pytest.skip, a skipif with another reason — fails, so that a test cannot pass
silently where it did not run."""
import pytest

NEEDS = ("needs hardware: ", "needs software: ")


def skip_reason(report):
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text[len("Skipped: "):] if text.startswith("Skipped: ") else text


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = skip_reason(report)
        if not reason.startswith(NEEDS):
            report.outcome = "failed"
            report.longrepr = (f"skipped without naming what it needs ('needs hardware: ...' or "
                               f"'needs software: ...', python/tests/needs.py): {reason}")
