"""Serving engines draftsmith starts on loopback: llama.cpp's server (regeneration, checks) and vLLM."""

ENGINES = ("llama.cpp", "vllm")  # what `serve-check --engine` runs
