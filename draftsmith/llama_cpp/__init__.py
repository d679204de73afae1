"""llama.cpp, owned in one place: its server in its own environment and greedy requests to it
(`server`, with `launch`, the script the engine's Python runs), its own GGUF converter for a
target folder or a staged drafter export (`convert`), and the checks on the target GGUF it serves
(`target_gguf`). Nothing here knows a drafter kind: each kind's export format entry stages its
layout for the converter (`draftsmith.export.gguf`). Used by data regeneration (`base_url:
local`), GGUF export, serve-check and the benchmark, which sit above it."""
