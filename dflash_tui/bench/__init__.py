"""Benchmarks (not tests): scripts that time parts of the engine."""
