"""The frozen target: where a spec points, loading it with its tokenizer and measured dtype, the
offline catalog of real models, weight-only quantization and chat replies."""
