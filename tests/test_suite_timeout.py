"""The suite never hangs: a test past its timeout fails, with the stack of
every thread, however it waits (pytest-timeout's ``thread`` method, set in
pyproject.toml). A hypothesis test that waits in a loop caught the default
signal once and ran on: a whole CI run waited for its limit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

HANGS = textwrap.dedent(
    """
    import threading

    from hypothesis import given, settings, strategies as st


    @settings(deadline=None, max_examples=5)
    @given(st.integers())
    def test_waits_forever(x):
        cond = threading.Condition()
        with cond:
            while True:
                cond.wait(0.05)
    """
)


def test_a_test_that_waits_forever_fails_at_its_timeout_with_the_stacks(tmp_path: Path) -> None:
    (tmp_path / "test_hangs.py").write_text(HANGS)
    # Not the Django settings a Django test of this process may have set: the file is no Django project's.
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
         "-p", "no:cacheprovider", "-p", "no:django", "-n", "0", "--timeout", "3", str(tmp_path / "test_hangs.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    assert "Timeout" in out and "cond.wait(0.05)" in out, out[-3000:]
