"""The lossless decoding engine: draft trees, verification, the target's cache runner, the
speculative loop (one sequence and batched) and the proposers that draft. Below the evaluation
harness (`draftsmith.eval`), which times and compares what this engine decodes."""
