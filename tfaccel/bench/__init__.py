"""Throughput measurements behind `bin/bench_sampler` (see ../shared/BENCHMARKS.md)."""
