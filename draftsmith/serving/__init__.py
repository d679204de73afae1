"""Serving engines draftsmith starts on loopback: llama.cpp's server for regeneration and checks."""
