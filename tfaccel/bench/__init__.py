"""Throughput measurements behind `bin/bench_sampler` (docs/results.md, "Throughput")."""
