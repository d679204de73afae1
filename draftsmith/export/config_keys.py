"""What a format's config.json must say for serving engines to build its drafter: the shared
arithmetic (sizes implied by the tensors) that each format's `config_keys` uses.

A format's `config_keys(drafter, config)` returns (key, value in config.json or `MISSING`, value
the tensors imply or None) for every key the engines read; `validate.check_config_keys` checks
them. Engines fill an absent key with a default (a Llama config's hidden_size is 4096), so a
missing key is as wrong as a mismatched one.
"""

from __future__ import annotations

MISSING = ...


def rows(state: dict, name: str) -> int | None:
    """Rows of tensor `name` (None when absent)."""
    return None if name not in state else int(state[name].shape[0])


def layer_keys(layer: dict, state: dict, prefix: str) -> dict[str, int | None]:
    """The attention / MLP sizes of a Llama-style layer config, each paired with what the tensors
    under `prefix` imply (None where no tensor tells)."""
    heads = layer.get("num_attention_heads")
    head_dim = layer.get("head_dim") or (layer["hidden_size"] // heads
                                         if heads and layer.get("hidden_size") else None)

    def rows_per(name: str, per: int | None = 1) -> int | None:
        tensor = state.get(prefix + name)
        return None if tensor is None or not per else tensor.shape[0] // per

    return {
        "intermediate_size": rows_per("mlp.gate_proj.weight"),
        "num_attention_heads": rows_per("self_attn.q_proj.weight", head_dim),
        "num_key_value_heads": rows_per("self_attn.k_proj.weight", head_dim),
        "rms_norm_eps": None,
    }
