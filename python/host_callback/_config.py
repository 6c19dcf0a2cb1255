"""Settings read from the environment when host_callback is imported.

``HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE``
    Per-device bound, in bytes, on tapped data waiting for its tap function
    (default 256e6, from 16e6 to 2**63-1; anything else is a
    ``ValueError`` that names the variable).  When a device's queue is full the device
    waits (back-pressure); nothing is dropped.
``HOST_CALLBACK_CUDA_PINNED_BYTE_SIZE``
    The pinned host memory GPU taps and calls copy into, taken once at the
    first GPU callback (default 256 MiB, from 4 MiB up).  A tap of up to
    half of it is copied in one piece; a larger one passes through it in
    chunks.  When it is full of taps still on their way the device waits.
    Read where the pool is set up, when host_callback first starts on a
    machine with CUDA devices (a malformed value is a ``ValueError`` there,
    naming the variable); a process without CUDA never reads it.
``HOST_CALLBACK_INLINE``
    ``1``/``true``: outside ``jax.jit`` and other staging, call tap functions
    directly in the calling thread (for debuggers and stack traces).
``HOST_CALLBACK_TAPS_BEFORE_RESULTS``
    ``1``/``true``: under ``jit`` the ``id_tap``/``id_print`` taps run
    inside the computation, in its thread, before it goes on, as its
    ``debug.*`` callbacks and progress bars always do: its results are
    ready only once they have run.  Their errors are still raised by
    ``barrier_wait``.  Default ``0``: taps run asynchronously, as in the
    removed ``jax.experimental.host_callback`` (``barrier_wait`` waits for
    them).

The legacy names ``JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE`` and
``JAX_HOST_CALLBACK_INLINE`` are honoured when the new ones are unset.
"""

from __future__ import annotations

import os

DEFAULT_MAX_QUEUE_BYTES = int(256e6)
MIN_MAX_QUEUE_BYTES = int(16e6)
# The runtime keeps the bound in a size_t; past this it means "no bound".
MAX_MAX_QUEUE_BYTES = 2**63 - 1
DEFAULT_CUDA_PINNED_BYTES = 256 << 20
MIN_CUDA_PINNED_BYTES = 4 << 20


def _env(name: str) -> tuple[str, str] | None:
  for full in ("HOST_CALLBACK_" + name, "JAX_HOST_CALLBACK_" + name):
    value = os.environ.get(full)
    if value is not None and value.strip() != "":
      return full, value.strip()
  return None


def _parse_bool(name: str, value: str) -> bool:
  lowered = value.lower()
  if lowered in ("1", "true", "yes", "on"):
    return True
  if lowered in ("0", "false", "no", "off"):
    return False
  raise ValueError(f"{name} must be a boolean (1/0, true/false), got {value!r}")


def _byte_size(name: str, default: int, low: int, high: int,
               example: str) -> int:
  """The number of bytes HOST_CALLBACK_<name> sets, validated."""
  found = _env(name)
  if found is None:
    return default
  full, value = found
  accepted = f"a number of bytes from {low} to {high}, such as {example}"
  number: int | float
  try:
    number = int(value)
  except ValueError:
    try:
      number = float(value)
    except ValueError:
      raise ValueError(f"{full} must be {accepted}; got {value!r}") from None
  if not low <= number <= high:  # nan too
    raise ValueError(f"{full} must be {accepted}; got {value!r}")
  return int(number)


def max_queue_bytes() -> int:
  """The queue bound from the environment, validated."""
  return _byte_size("MAX_QUEUE_BYTE_SIZE", DEFAULT_MAX_QUEUE_BYTES,
                    MIN_MAX_QUEUE_BYTES, MAX_MAX_QUEUE_BYTES, "256e6")


def cuda_pinned_bytes() -> int:
  """The size of the pinned pool of GPU callbacks, validated (read when
  the CUDA handlers are registered, not when the package is imported)."""
  return _byte_size("CUDA_PINNED_BYTE_SIZE", DEFAULT_CUDA_PINNED_BYTES,
                    MIN_CUDA_PINNED_BYTES, MAX_MAX_QUEUE_BYTES, "512e6")


def inline() -> bool:
  """Whether HOST_CALLBACK_INLINE asks for inline calls."""
  found = _env("INLINE")
  return False if found is None else _parse_bool(*found)


def taps_before_results() -> bool:
  """Whether HOST_CALLBACK_TAPS_BEFORE_RESULTS asks for id_tap's taps to
  be delivered before a program's results are ready."""
  found = _env("TAPS_BEFORE_RESULTS")
  return False if found is None else _parse_bool(*found)


MAX_QUEUE_BYTES: int = max_queue_bytes()
INLINE: bool = inline()
TAPS_BEFORE_RESULTS: bool = taps_before_results()
