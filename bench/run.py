"""Benchmarks of host_callback against JAX's own callbacks (``make bench``).

    .venv/bin/python bench/run.py [--smoke] [--out DIR] [--reps N] [--steps N]
        [--clients-python PY] [--clients-only]

Writes RESULTS.md and the plots into ``--out`` (bench/results by default).
The harness is the package hcb_bench beside this file; what it measures,
how and why is in bench/README.md.
"""

import sys

if __name__ == "__main__":
  if sys.argv[1:2] == ["--clients-worker"]:
    # A child of measurement 9, in the clients' environment (which has the
    # libraries, not the plotting of the rest).
    from hcb_bench import clients
    sys.exit(clients.worker_main(sys.argv[2]))
  from hcb_bench import cli
  sys.exit(cli.main())
