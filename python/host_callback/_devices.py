"""Devices: which device a callback runs on, and the runtime's key of it.

The C runtime keys its queues by device (HCB_DEVICE in include/hcb/hcb.h:
the platform and the ordinal XLA's FFI gives the handlers); Python turns a
``jax.Device`` into that key (:func:`device_key`) and back
(:func:`device_for_key`, which the extension calls once per device).  A
callback's ``device_index`` is checked where it is bound.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from host_callback import _hcb
from host_callback._state import state

_PLATFORM_CPU = _hcb.PLATFORM_CPU
_PLATFORM_CUDA = _hcb.PLATFORM_CUDA


def checked_device_index(device_index: Any, what: str) -> int:
  """``device_index`` as an int, or a clear error: it indexes the devices of
  the computation, so it must be below ``jax.device_count()`` (this
  process's devices, and under ``jax.distributed`` every process's: a
  global computation counts them all).  Checked where the callback is
  bound, so that a program on one device (or under ``pmap``/``shard_map``,
  where every device calls) does not silently accept it; jit over sharded
  operands checks it against the computation's own devices when lowering
  (_lowering.py)."""
  if isinstance(device_index, bool) or not isinstance(
      device_index, (int, np.integer)):
    raise TypeError(f"{what}: device_index must be an int, got "
                    f"{device_index!r}")
  count = jax.device_count()
  if not 0 <= device_index < count:
    raise ValueError(
        f"{what}: device_index={int(device_index)} is out of range: JAX has "
        f"{count} device{'s' if count != 1 else ''}, so device_index must be "
        f"from 0 to {count - 1}")
  return int(device_index)


def inline_device(device_index: int, what: str) -> jax.Device:
  """The device an inline callback (HOST_CALLBACK_INLINE) is given: the
  ``device_index``-th of this process's devices.  A ``device_index`` that
  passed :func:`checked_device_index` can still name another process's
  device under ``jax.distributed``: a clear error then."""
  devices = jax.local_devices()
  if device_index >= len(devices):
    count = len(devices)
    raise ValueError(
        f"{what}: device_index={device_index} is out of range for an inline "
        f"callback, which runs in this process: it has {count} local "
        f"device{'s' if count != 1 else ''}, so device_index must be from 0 "
        f"to {count - 1}")
  return devices[device_index]


def device_key(device: jax.Device) -> int:
  """The runtime's key of a CPU or local CUDA device (HCB_DEVICE in
  include/hcb/hcb.h): the platform in the high 32 bits, the ordinal that
  XLA's FFI gives the handlers in the low ones (a CPU device's id, a CUDA
  device's process-local hardware id)."""
  if device.platform == "cpu":
    return (_PLATFORM_CPU << 32) | device.id
  if device.platform == "gpu" and device.local_hardware_id is not None:
    return (_PLATFORM_CUDA << 32) | device.local_hardware_id
  raise ValueError(f"host_callback: {device} is neither a CPU device nor a "
                   "CUDA device of this process")


def keyed_devices() -> list[jax.Device]:
  """The devices whose callbacks reach this process's runtime: the CPU
  devices and the local CUDA devices (once the runtime has started)."""
  return [*jax.devices("cpu"), *state.cuda_devices]


def device_for_key(key: int) -> jax.Device:
  """The jax.Device a record came from (called once per device, then
  cached in C)."""
  platform, ordinal = key >> 32, key & 0xFFFFFFFF
  if platform == _PLATFORM_CPU:
    for dev in jax.devices("cpu"):
      if dev.id == ordinal:
        return dev
  if platform == _PLATFORM_CUDA:
    for dev in local_cuda_devices():
      if dev.local_hardware_id == ordinal:
        return dev
  raise LookupError(f"no JAX device for platform {platform} ordinal {ordinal}")


def local_cuda_devices() -> list[jax.Device]:
  """This process's CUDA devices; none when JAX has no CUDA backend (no
  plugin, a plugin that failed to initialise, ``JAX_PLATFORMS`` without
  it).  Initialises JAX's backends if they are not yet."""
  try:
    return list(jax.local_devices(backend="cuda"))
  except RuntimeError:  # "Unknown backend", "Backend 'cuda' failed ..."
    return []
