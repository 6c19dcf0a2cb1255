"""The benchmark harness behind bench/run.py (``make bench``); its modules,
and what it measures and why, are described in bench/README.md."""

import os

# Set before anything imports jax, which reads them once.  One CPU device:
# every number is about device 0 and its consumer thread -- but in the
# children of measurement 11 (sharded.py), which are given their own
# number of devices in HCB_BENCH_DEVICES.
os.environ["JAX_NUM_CPU_DEVICES"] = os.environ.get("HCB_BENCH_DEVICES", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# numpy's BLAS threads spin after use; on a 2-core machine they steal from
# whichever variant runs next.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
