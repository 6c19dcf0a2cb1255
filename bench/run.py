"""Benchmarks of host_callback against JAX's own callbacks (``make bench``).

    .venv/bin/python bench/run.py [--smoke] [--out DIR] [--reps N] [--steps N]

Writes RESULTS.md and the plots into ``--out`` (bench/results by default).
The harness is the package hcb_bench beside this file; what it measures,
how and why is in bench/README.md.
"""

import sys

from hcb_bench import cli

if __name__ == "__main__":
  sys.exit(cli.main())
