"""The tests' warm interpreters (warm_python.py) run a program as a fresh
``python -c`` or ``python script.py`` does: what it sees, what it writes,
and how it ends are the same both ways."""

from __future__ import annotations

import pathlib
import signal
import subprocess

import pytest

from conftest import run_python, start_python

# What a program can see of how it was started.
LOOK = """
import os, sys
print("argv", sys.argv)
print("name", __name__, "file", globals().get("__file__"))
print("path0", repr(sys.path[0]))
print("cwd", os.getcwd() == os.environ["WANT_CWD"])
print("env", os.environ.get("HOST_CALLBACK_TEST_WORD"))
print("stdin", sys.stdin.read() == "")
"""

ENDINGS = {
    # A script's traceback names its file.
    "raises in a script": "x = 1\nraise ValueError('the words')\n",
    # An uncaught exception: its traceback from the program's line, exit 1.
    "raises": "x = 1\nraise ValueError('the words')\n",
    # SystemExit's code; atexit and non-daemon threads run first.
    "exits": ("import atexit, sys, threading, time\n"
              "atexit.register(print, 'at exit')\n"
              "threading.Thread(target=lambda: (time.sleep(0.2), "
              "print('thread done', flush=True))).start()\n"
              "sys.exit(3)\n"),
    # An uncaught KeyboardInterrupt ends the process by SIGINT.
    "interrupted": ("import os, signal\n"
                    "os.kill(os.getpid(), signal.SIGINT)\n"),
}


def _both(code, **kwargs):
  warm = run_python(code, timeout=60, **kwargs)
  fresh = run_python(code, timeout=60, fresh=True, **kwargs)
  return warm, fresh


def test_a_program_sees_its_arguments_environment_and_folder(tmp_path):
  env = {"HOST_CALLBACK_TEST_WORD": "warm", "WANT_CWD": str(tmp_path)}
  warm, fresh = _both(LOOK, env=env, args=("a", "b c"), cwd=tmp_path)
  assert warm.returncode == fresh.returncode == 0, warm.stderr + fresh.stderr
  assert warm.stdout == fresh.stdout
  assert "argv ['-c', 'a', 'b c']" in warm.stdout
  assert "env warm" in warm.stdout and "cwd True" in warm.stdout


def test_a_script_sees_its_path_and_folder(tmp_path: pathlib.Path):
  (tmp_path / "look.py").write_text(LOOK)
  (tmp_path / "sub").mkdir()
  env = {"WANT_CWD": str(tmp_path / "sub")}
  warm, fresh = _both(None, env=env, path="../look.py", args=("x",),
                      cwd=tmp_path / "sub")
  assert warm.returncode == fresh.returncode == 0, warm.stderr + fresh.stderr
  assert warm.stdout == fresh.stdout
  assert "argv ['../look.py', 'x']" in warm.stdout
  assert f"path0 {str(tmp_path)!r}" in warm.stdout


@pytest.mark.parametrize("ending", ENDINGS)
def test_a_program_ends_as_with_a_fresh_interpreter(ending, tmp_path):
  if ending.endswith("in a script"):
    (tmp_path / "end.py").write_text(ENDINGS[ending])
    warm, fresh = _both(None, path="end.py", cwd=tmp_path)
  else:
    warm, fresh = _both(ENDINGS[ending])
  assert warm.returncode == fresh.returncode
  assert warm.stdout == fresh.stdout
  assert warm.stderr == fresh.stderr
  want = {"exits": 3, "interrupted": -signal.SIGINT}.get(ending, 1)
  assert warm.returncode == want, warm.stderr
  if ending == "raises":  # the program's line, and no line of the server
    lines = warm.stderr.splitlines()
    assert lines[1] == '  File "<string>", line 2, in <module>', lines
    assert lines[-1] == "ValueError: the words", lines
  if ending == "exits":
    assert warm.stdout == "thread done\nat exit\n"


def test_a_program_past_its_time_is_killed():
  with pytest.raises(subprocess.TimeoutExpired):
    run_python("import time; time.sleep(60)", timeout=1)
  proc = start_python("import time\nprint('up', flush=True)\ntime.sleep(60)")
  assert proc.stdout.readline() == "up\n"
  proc.send_signal(signal.SIGTERM)
  assert proc.wait(30) == -signal.SIGTERM
