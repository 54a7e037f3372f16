"""Bridges to XLA (through jaxlib): its SPMD partitioner, Shardy's passes, its per-pass dumps."""
