"""The benchmark suite: ``python -m benchmarks.run`` (``--quick`` for a smoke run)."""
