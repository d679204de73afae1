"""The accelerate training loop, checkpoints and resume, logging."""
