"""The PNG plots next to RESULTS.md: per-step cost, tap bandwidth against
memcpy, per-call dispatch.  matplotlib is imported only when one is drawn."""

from __future__ import annotations

import numpy as np

from hcb_bench.cases import DispatchResult
from hcb_bench.cases import PayloadResult
from hcb_bench.cases import StepResult
from hcb_bench.harness import size_label


def plot_per_step(steps: dict[str, StepResult], path: str) -> None:
  """Bars: per-step cost over the baseline, device-side and end to end."""
  import matplotlib.pyplot as plt
  base = steps["baseline"]
  keys = [k for k, r in steps.items()
          if k != "baseline" and not r.diagnostic]
  labels = [steps[k].label.replace("`", "") for k in keys]
  fig, ax = plt.subplots(figsize=(9, 5.5))
  y = np.arange(len(keys))
  for offset, (name, attr) in zip((-0.2, 0.2), (
      ("device-side", "device"), ("end to end", "end_to_end"))):
    samples = [getattr(steps[k], attr).minus(getattr(base, attr)).map(
        lambda s: max(s * 1e6, 1e-3)) for k in keys]
    med = np.array([s.median for s in samples])
    err = np.array([[m - s.lo for s, m in zip(samples, med)],
                    [s.hi - m for s, m in zip(samples, med)]])
    ax.barh(y + offset, med, height=0.4, xerr=err, label=name, capsize=2)
  ax.set_yticks(y, labels)
  ax.invert_yaxis()
  ax.set_xscale("log")
  ax.set_xlabel("µs per scan step over the baseline (median, min–max)")
  ax.set_title("Per-step cost of a callback in lax.scan, 4-byte payload")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_payload(payload: list[PayloadResult], path: str) -> None:
  """Lines: GB/s against bytes per tap, taps and memcpy."""
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(8, 5))
  sizes = [p.size for p in payload]
  for label, attr, style in (
      ("id_tap (Python), end to end", "tap_e2e", "o-"),
      ("id_tap (Python), device-side", "tap_device", "o--"),
      ("native tap, end to end", "native_e2e", "s-"),
      ("memcpy, warm buffer", "memcpy", "k^-"),
      ("malloc + memcpy + free", "fresh_memcpy", "kv--")):
    ax.plot(sizes, [getattr(p, attr).median for p in payload], style,
            label=label)
  ax.set_xscale("log", base=2)
  ax.set_yscale("log")
  ax.set_xticks(sizes, [size_label(s) for s in sizes])
  ax.set_xlabel("bytes per tap")
  ax.set_ylabel("GB/s (median)")
  ax.set_title("Tap bandwidth against memcpy")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_dispatch(dispatch: dict[str, DispatchResult], path: str) -> None:
  """Bars: µs per call of the small jitted function, dispatch and end to
  end."""
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(9, 4.5))
  names = list(dispatch)
  x = np.arange(len(names))
  for offset, (label, attr) in zip((-0.2, 0.2), (
      ("last result ready", "dispatch"), ("every callback done",
                                          "end_to_end"))):
    samples = [getattr(dispatch[n], attr).map(lambda v: v * 1e6)
               for n in names]
    med = np.array([s.median for s in samples])
    err = np.array([[m - s.lo for s, m in zip(samples, med)],
                    [s.hi - m for s, m in zip(samples, med)]])
    ax.bar(x + offset, med, width=0.4, yerr=err, capsize=3, label=label)
  ax.set_xticks(x, [n.replace("`", "").replace(", ", "\n") for n in names])
  ax.set_yscale("log")
  ax.set_ylabel("µs per call (median, min–max)")
  ax.set_title("Per-call time of a small jitted function")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)

