"""Speculative decoding: trees, verification, the decoding loop, metrics and benchmarks."""
