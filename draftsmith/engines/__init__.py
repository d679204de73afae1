"""Serving engines as processes: llama.cpp's server and vLLM, each in its own environment under
the draftsmith cache, their launch, requests and counters. Used by data regeneration, GGUF export
and serve-check (`draftsmith.serving`), which sit above it."""
