"""Engine proofs the model cards cite: written by benchmarks/engine-proof/table.py from
benchmarks/engine-proof/results.json; do not edit by hand."""

PROOFS = {}
