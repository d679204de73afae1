"""serve-check: a drafter export proven in a real serving engine (the engines' processes are in
`draftsmith.engines` and `draftsmith.llama_cpp`), the engine's outputs and acceptance next to
draftsmith's own loop."""

ENGINES = ("llama.cpp", "vllm")  # what `serve-check --engine` runs
