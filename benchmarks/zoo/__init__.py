"""The zoo: many simulated worlds drawn from stated distributions over the realism knobs, and every optimizer
run on each the same way (``python -m benchmarks.zoo``; see benchmarks/zoo/README.md and docs/zoo.md)."""
