"""Small JAX programs (spec, equivalent rewrites, seeded bugs) for testing and benchmarking tv."""
