"""Targets for the checks that run before a target is served or used: tiny GGUF files written with
the `gguf` package (a header and an embedding table that say which model they are), and a fetched
offline model in a private cache whose catalog entry knows its GGUF's sha256."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from draftsmith.target import file_hashes, offline_models
from draftsmith.target.offline_models import MARKER, OfflineModel
from tests.helpers.tiny_targets import tiny_target
from tests.helpers.tiny_tokenizers import char_tokenizer


def write_tiny_gguf(path: Path, *, arch: str = "llama", hidden: int = 32, layers: int = 4,
                    vocab: int = 128) -> Path:
    """A GGUF whose header says `arch`, `hidden`, `layers` and whose `token_embd.weight` has
    `vocab` rows (the tiny targets' shape by default)."""
    from gguf import GGUFWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(path, arch)
    writer.add_block_count(layers)
    writer.add_embedding_length(hidden)
    writer.add_context_length(512)
    writer.add_token_list([f"t{i}" for i in range(vocab)])
    rng = np.random.default_rng(0)
    writer.add_tensor("token_embd.weight", rng.standard_normal((vocab, hidden), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def fetched_offline_model(tmp_path: Path, monkeypatch) -> OfflineModel:
    """A fetched catalog entry `tiny-offline` in a private cache (`$DRAFTSMITH_CACHE`): a tiny
    GGUF whose size and sha256 the catalog knows, and a converted folder (tiny Llama and
    character tokenizer) with the marker that records its files' sha256."""
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(file_hashes, "_hashed", {})
    data = write_tiny_gguf(tmp_path / "source.gguf").read_bytes()
    model = OfflineModel("tiny-offline", "test-org/tiny", (), "tiny.gguf", len(data),
                         hashlib.sha256(data).hexdigest())
    monkeypatch.setitem(offline_models.CATALOG, model.name, model)
    gguf = offline_models.gguf_path(model.name)
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(data)
    folder = offline_models.model_dir(model.name)
    tiny_target("llama").save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    files = {p.name: offline_models.sha256_file(p) for p in sorted(folder.iterdir())}
    (folder / MARKER).write_text(json.dumps({"name": model.name, "files_sha256": files}))
    return model
