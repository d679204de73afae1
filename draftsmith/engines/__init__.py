"""Serving engines as processes: vLLM in its own environment under the draftsmith cache, and what
every engine shares (those environments, a server process on loopback, requests and counters).
llama.cpp builds on these in `draftsmith.llama_cpp`. Used by data regeneration, GGUF export and
serve-check (`draftsmith.serving`), which sit above it."""
