"""Python programs for the tests, started from an interpreter that has
already imported JAX.

Many tests run a snippet in its own process: for settings that must be in
place before JAX or host_callback start, for exits, forks and Ctrl-C.
Importing JAX is most of what such a process costs (about 1 CPU-second,
on every JAX version), and the tests start a hundred of them per suite.
So each test worker keeps a server per environment: a ``python -c``
interpreter that has imported ``jax`` and ``numpy`` and then forks a child
for each program.  The child takes the program's standard streams and
environment and runs the code as ``python -c`` would: as ``__main__``,
with ``sys.argv`` ``["-c", *args]``, an uncaught exception printed by
``sys.excepthook`` and exit status 1, an uncaught KeyboardInterrupt ending
it by SIGINT, and the interpreter's own exit (threads joined, ``atexit``)
at the end.

What differs from a fresh ``python -c``: ``jax`` and ``numpy`` are in
``sys.modules`` before the first line, so JAX read its environment
variables when the server started.  A server serves only programs whose
environment is the one it started with, except for the variables that
nothing reads before ``host_callback`` is imported (``PYTEST_CURRENT_TEST``,
``PWD`` and host_callback's own settings, ``HOST_CALLBACK_PATCH`` aside: the
startup hook reads it).  A program that sets ``JAX_*`` variables in
``os.environ`` itself must start fresh (``fresh=True``), as must one that
tests what importing does; ``HOST_CALLBACK_TEST_FRESH=1`` starts every
program fresh, to check that the two agree.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from typing import Any

# The server: runs as `python -c SERVER <socket fd>`.  It reports "ready"
# once JAX is imported, then for each request forks a child, answers with
# the child's pid, and when a child ends, with its wait status.
SERVER = r"""
import builtins, json, linecache, os, select, signal, socket, sys, types
import jax, jax.numpy, numpy

def reap(sock):
  while True:
    try:
      pid, status = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
      return
    if pid == 0:
      return
    sock.send(json.dumps({"ended": pid, "status": status}).encode())

def become(request, fds):
  for target, fd in enumerate(fds):
    os.dup2(fd, target)
    os.close(fd)
  os.environ.clear()
  os.environ.update(request["env"])
  os.chdir(request["cwd"])
  main = types.ModuleType("__main__")
  main.__builtins__ = builtins
  path = request["path"]
  if path is None:  # python -c code
    sys.argv = ["-c", *request["args"]]
    if "<string>" in linecache.cache:  # Python 3.13 shows -c's lines
      linecache.cache["<string>"] = (
          len(request["code"]), None,
          [line + "\n" for line in request["code"].splitlines()], "<string>")
  else:  # python path: the script's folder leads sys.path
    sys.argv = [path, *request["args"]]
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    path = main.__file__ = os.path.join(os.getcwd(), path)
  sys.modules["__main__"] = main
  try:
    code = compile(request["code"], path or "<string>", "exec")
    exec(code, main.__dict__)
  except SystemExit:
    raise
  except BaseException as e:
    e.__traceback__ = e.__traceback__.tb_next  # from the program's line
    sys.excepthook(type(e), e, e.__traceback__)
    if isinstance(e, KeyboardInterrupt):  # as CPython ends: by the signal
      sys.stdout.flush(); sys.stderr.flush()
      signal.signal(signal.SIGINT, signal.SIG_DFL)
      os.kill(os.getpid(), signal.SIGINT)
    raise SystemExit(1)
  raise SystemExit(0)

def serve(sock):
  wake_r, wake_w = os.pipe()
  os.set_blocking(wake_r, False)
  os.set_blocking(wake_w, False)
  signal.set_wakeup_fd(wake_w)
  signal.signal(signal.SIGCHLD, lambda *_: None)
  sock.send(b'{"ready": true}')
  while True:
    ready, _, _ = select.select([sock, wake_r], [], [])
    if wake_r in ready:
      while True:
        try:
          if not os.read(wake_r, 512):
            break
        except BlockingIOError:
          break
      reap(sock)
    if sock in ready:
      message, fds, _, _ = socket.recv_fds(sock, 1 << 22, 3)
      if not message:  # the tests are done
        return
      request = json.loads(message)
      sys.stdout.flush(); sys.stderr.flush()
      pid = os.fork()
      if pid == 0:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sock.close(); os.close(wake_r); os.close(wake_w)
        become(request, fds)
      for fd in fds:
        os.close(fd)
      sock.send(json.dumps({"started": pid}).encode())

serve(socket.socket(fileno=int(sys.argv[1])))
"""

# Variables no interpreter reads before the program imports host_callback:
# a server started under other values serves the program all the same.
def _startup_key(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
  def read_late(name: str) -> bool:
    if name in ("PYTEST_CURRENT_TEST", "PWD"):
      return True
    ours = name.startswith(("HOST_CALLBACK_", "JAX_HOST_CALLBACK_"))
    return ours and name != "HOST_CALLBACK_PATCH"
  return tuple(sorted((k, v) for k, v in env.items() if not read_late(k)))


class _Server:
  """One warm interpreter, and the statuses of the children it forked."""

  def __init__(self, env: dict[str, str]) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    self._sock = ours
    self._proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(theirs.fileno())],
        pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL)
    theirs.close()
    self._lock = threading.Lock()  # one request at a time
    self._cond = threading.Condition()
    self._started: list[int] = []
    self._ended: dict[int, int] = {}
    self._gone = False  # the server ended: no more statuses come
    self.running = 0
    if json.loads(self._sock.recv(1 << 16)) != {"ready": True}:
      raise RuntimeError("the warm Python server did not start")
    threading.Thread(target=self._read, daemon=True).start()

  def _read(self) -> None:
    while True:
      message = self._sock.recv(1 << 16)
      with self._cond:
        if not message:
          self._gone = True
          self._cond.notify_all()
          return
        reply = json.loads(message)
        if "started" in reply:
          self._started.append(reply["started"])
        else:
          self._ended[reply["ended"]] = reply["status"]
          self.running -= 1
        self._cond.notify_all()

  def start(self, code: str, path: str | None, args: list[str],
            env: dict[str, str], cwd: str, fds: list[int]) -> int:
    request = json.dumps({"code": code, "path": path, "args": args,
                          "env": env, "cwd": cwd}).encode()
    with self._lock:
      with self._cond:
        self.running += 1
      socket.send_fds(self._sock, [request], fds)
      with self._cond:
        self._cond.wait_for(lambda: self._started)
        return self._started.pop()

  def status(self, pid: int, timeout: float | None) -> int | None:
    """The child's wait status, once it has ended (None until then)."""
    with self._cond:
      self._cond.wait_for(lambda: pid in self._ended or self._gone, timeout)
      if pid not in self._ended and self._gone:
        raise RuntimeError(f"the warm Python server of child {pid} ended")
      return self._ended.get(pid)

  def close(self) -> None:
    # shutdown, not only close: the reader thread is blocked in recv on
    # this socket, and the server sees its end only once that returns.
    # It then ends (subprocess reaps it later).
    self._sock.shutdown(socket.SHUT_RDWR)
    self._sock.close()


_servers: dict[tuple[tuple[str, str], ...], _Server] = {}
_servers_lock = threading.Lock()
MAX_IDLE_SERVERS = 3


def _server_for(env: dict[str, str]) -> _Server:
  key = _startup_key(env)
  with _servers_lock:
    server = _servers.pop(key, None) or _Server(env)
    _servers[key] = server  # the most recently used last
    idle = [k for k, s in _servers.items() if s.running == 0 and k != key]
    for k in idle[:max(0, len(idle) - MAX_IDLE_SERVERS)]:
      _servers.pop(k).close()
    return server


class WarmProcess:
  """A child of a warm server, with the parts of subprocess.Popen that the
  tests use: text ``stdout`` and ``stderr`` pipes, ``poll``, ``wait``,
  ``communicate``, ``send_signal``, ``kill`` and ``returncode``."""

  def __init__(self, server: _Server, code: str, path: str | None,
               args: list[str], env: dict[str, str], cwd: str) -> None:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    stdin = os.open(os.devnull, os.O_RDONLY)
    try:
      self.pid = server.start(code, path, args, env, cwd,
                              [stdin, out_w, err_w])
    finally:
      for fd in (stdin, out_w, err_w):
        os.close(fd)
    self._server = server
    self.stdout = open(out_r, encoding="utf-8", errors="replace")
    self.stderr = open(err_r, encoding="utf-8", errors="replace")
    self.returncode: int | None = None

  def wait(self, timeout: float | None = None) -> int:
    if self.returncode is None:
      status = self._server.status(self.pid, timeout)
      if status is None:
        raise subprocess.TimeoutExpired(["python", "-c"], timeout or 0)
      self.returncode = os.waitstatus_to_exitcode(status)
    return self.returncode

  def poll(self) -> int | None:
    try:
      return self.wait(0)
    except subprocess.TimeoutExpired:
      return None

  def communicate(self, timeout: float | None = None) -> tuple[str, str]:
    """Reads both pipes to their end and waits for the child, as
    Popen.communicate does (the same TimeoutExpired when it is late)."""
    text = {"stdout": "", "stderr": ""}

    def read(name: str) -> None:
      text[name] = getattr(self, name).read()

    readers = [threading.Thread(target=read, args=(n,), daemon=True)
               for n in text]
    for r in readers:
      r.start()
    for r in readers:
      r.join(timeout)
      if r.is_alive():
        raise subprocess.TimeoutExpired(["python", "-c"], timeout or 0)
    self.wait(timeout)
    return text["stdout"], text["stderr"]

  def send_signal(self, sig: int) -> None:
    if self.poll() is None:
      os.kill(self.pid, sig)

  def kill(self) -> None:
    self.send_signal(signal.SIGKILL)


def start_python(code: str | None, env: dict[str, str] | None = None,
                 args: list[str] | tuple[str, ...] = (), fresh: bool = False,
                 path: str | os.PathLike[str] | None = None,
                 cwd: str | os.PathLike[str] | None = None,
                 replace_env: bool = False) -> Any:
  """Starts ``python -c code *args``, or with ``path`` (and no code)
  ``python path *args``, in ``cwd``, with ``os.environ`` updated by ``env``
  (or replaced by it, with ``replace_env``): a child of a warm server (a
  WarmProcess), or with ``fresh`` (or HOST_CALLBACK_TEST_FRESH=1) a new
  interpreter (a subprocess.Popen).  Both have text ``stdout`` and
  ``stderr`` pipes."""
  full_env = {} if replace_env else dict(os.environ)
  full_env.update(env or {})
  where = os.fspath(cwd if cwd is not None else os.getcwd())
  script = None if path is None else os.fspath(path)
  if script is None:
    assert code is not None, "start_python needs code or a path"
    code = textwrap.dedent(code)
  if fresh or os.environ.get("HOST_CALLBACK_TEST_FRESH") == "1":
    command = ([script] if script is not None else ["-c", str(code)])
    return subprocess.Popen([sys.executable, *command, *args], cwd=where,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=full_env)
  if script is not None:
    code = pathlib.Path(where, script).read_text()
  assert code is not None
  return WarmProcess(_server_for(full_env), code, script, list(args),
                     full_env, where)


def run_python(code: str | None, env: dict[str, str] | None = None,
               timeout: float = 240, args: list[str] | tuple[str, ...] = (),
               fresh: bool = False, path: str | os.PathLike[str] | None = None,
               cwd: str | os.PathLike[str] | None = None,
               replace_env: bool = False) -> subprocess.CompletedProcess[str]:
  """Runs a program (see start_python) to its end, as subprocess.run with
  capture_output does: the same result, and the same TimeoutExpired (the
  child killed) when it takes longer than ``timeout``."""
  proc = start_python(code, env, args, fresh, path, cwd, replace_env)
  try:
    out, err = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    proc.kill()
    raise
  return subprocess.CompletedProcess(
      ["python", *(["-c", code] if path is None else [os.fspath(path)]),
       *args], proc.returncode, out, err)
