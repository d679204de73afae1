"""Checks that an exported drafter fits a target before anything is decoded: hidden size, vocab,
draft vocab and (EAGLE-3) the target layers it fuses, and that its config.json carries every key
the serving engines of its format read. Every error names both values.

Train/serve mismatches are the usual reason a good drafter serves badly (REFERENCE.md section 4):
a wrong layer id silently costs most of the acceptance, so it is an error here, not a warning.
"""

from __future__ import annotations

from itertools import pairwise

from draftsmith.errors import DraftsmithError
from draftsmith.export.record import ExportedDrafter


def check_layer_ids(ids: list[int], num_layers: int, where: str, servable: bool = True) -> None:
    """EAGLE-3 aux layer ids: three 0-based layer outputs inside the target; for serving also
    strictly increasing, because vLLM and SGLang capture each layer once, in layer order.

    Raises:
        DraftsmithError: naming the ids and the target's layer count.
    """
    if len(ids) != 3:
        raise DraftsmithError(f"{where}: EAGLE-3 fuses 3 target layers but the aux layer ids are "
                              f"{ids}")
    outside = [i for i in ids if not 0 <= i < num_layers]
    if outside:
        raise DraftsmithError(
            f"{where}: aux layer ids {ids} (0-based layer outputs) include {outside}, outside the "
            f"target's layers 0..{num_layers - 1} (the target has num_hidden_layers={num_layers}); "
            "use the target the drafter was trained for")
    if servable and any(b <= a for a, b in pairwise(ids)):
        raise DraftsmithError(
            f"{where}: aux layer ids {ids} are not strictly increasing; vLLM and SGLang capture each "
            "target layer once, in layer order, so this drafter cannot be served. Retrain with "
            "distinct increasing `drafter.layer_ids` (the default is)")


def check_export_fits_target(drafter: ExportedDrafter, target_config, where: str) -> None:
    """The drafter's recorded shapes against the target's config.

    Args:
        drafter: read from an export folder.
        target_config: the target model's config (or any object with its attributes).
        where: names the export in messages (its folder).

    Raises:
        DraftsmithError: hidden size, vocab, draft vocab, layer ids or MTP numbering mismatch.
    """
    hidden = target_config.hidden_size
    vocab = target_config.vocab_size
    layers = target_config.num_hidden_layers
    if drafter.hidden_size != hidden:
        raise DraftsmithError(
            f"{where}: the drafter has hidden_size={drafter.hidden_size} but the target has "
            f"hidden_size={hidden}; use the target it was trained for")
    if drafter.vocab_size is not None and drafter.vocab_size != vocab:
        raise DraftsmithError(
            f"{where}: the drafter has vocab_size={drafter.vocab_size} but the target has "
            f"vocab_size={vocab}; drafter and target must share one tokenizer")
    if drafter.draft_vocab_size is not None and not 1 <= drafter.draft_vocab_size <= vocab:
        raise DraftsmithError(
            f"{where}: draft_vocab_size={drafter.draft_vocab_size} must be between 1 and the "
            f"target's vocab_size={vocab}")
    if drafter.kind == "eagle3" and drafter.aux_layer_ids:
        check_layer_ids(drafter.aux_layer_ids, layers, where, servable=False)
    if drafter.mtp_first_layer is not None and drafter.mtp_first_layer not in (0, layers):
        raise DraftsmithError(
            f"{where}: the MTP modules are numbered from layer {drafter.mtp_first_layer} but the "
            f"target has num_hidden_layers={layers} (the DeepSeek-V3 layout numbers the first "
            "module N, SGLang's NextN layout 0)")


def _layer_keys(layer: dict, state: dict, prefix: str) -> dict[str, int | None]:
    """The attention / MLP sizes of a Llama-style layer config, each paired with what the tensors
    under `prefix` imply (None where no tensor tells)."""
    heads = layer.get("num_attention_heads")
    head_dim = layer.get("head_dim") or (layer["hidden_size"] // heads
                                         if heads and layer.get("hidden_size") else None)

    def rows(name: str, per: int | None = 1) -> int | None:
        tensor = state.get(prefix + name)
        return None if tensor is None or not per else tensor.shape[0] // per

    return {
        "intermediate_size": rows("mlp.gate_proj.weight"),
        "num_attention_heads": rows("self_attn.q_proj.weight", head_dim),
        "num_key_value_heads": rows("self_attn.k_proj.weight", head_dim),
        "rms_norm_eps": None,
    }


def _rows(state: dict, name: str) -> int | None:
    return None if name not in state else int(state[name].shape[0])


def required_config_keys(drafter: ExportedDrafter, config: dict) -> list[tuple[str, object, object]]:
    """(key, value in config.json or `...` when absent, value the tensors imply or None) for every
    config.json key the serving engines of `drafter.format` read to build the model.

    Engines fill an absent key with a default (a Llama config's hidden_size is 4096), so a
    missing key is as wrong as a mismatched one.
    """
    state, fmt = drafter.state, drafter.format
    missing = ...
    if fmt in ("eagle3", "speculators"):
        layer = (config.get("transformer_layer_config") or {}) if fmt == "speculators" else config
        where = "transformer_layer_config." if fmt == "speculators" else ""
        implied = {"hidden_size": _rows(state, "fc.weight"), "vocab_size": _rows(state, "t2d"),
                   **_layer_keys(layer, state, "midlayer.")}
        keys = [(where + k, layer.get(k, missing), v) for k, v in implied.items()]
        keys.append(("draft_vocab_size", config.get("draft_vocab_size", missing),
                     _rows(state, "lm_head.weight")))
        if fmt == "speculators":
            methods = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
            verifier = (config.get("speculators_config") or {}).get("verifier") or {}
            keys += [("speculators_config.proposal_methods[0].speculative_tokens",
                      methods[0].get("speculative_tokens", missing), None),
                     ("speculators_config.verifier.name_or_path",
                      verifier.get("name_or_path", missing), None)]
        return keys
    if fmt == "eagle":
        implied = {"hidden_size": _rows(state, "fc.weight"),
                   "vocab_size": _rows(state, "embed_tokens.weight"),
                   **_layer_keys(config, state, "layers.0.")}
        return [(k, config.get(k, missing), v) for k, v in implied.items()]
    if fmt == "medusa":
        # read_medusa already refuses a medusa_num_heads below the trained heads
        implied = {"hidden_size": drafter.hidden_size, "vocab_size": drafter.vocab_size,
                   "medusa_num_heads": None, "medusa_num_layers": drafter.settings["num_layers"]}
        return [(k, config.get(k, missing), v) for k, v in implied.items()]
    if fmt == "mtp":
        implied = {"hidden_size": _rows(state, "layers.0.eh_proj.weight"),
                   "vocab_size": _rows(state, "embed_tokens.weight"),
                   "num_hidden_layers": None,
                   "num_nextn_predict_layers": drafter.settings["num_modules"],
                   **_layer_keys(config, state, "layers.0.block.")}
        return [(k, config.get(k, missing), v) for k, v in implied.items()]
    return []


def check_config_keys(drafter: ExportedDrafter, config: dict, where: str) -> None:
    """Every config.json key the engines of the drafter's format read is present and agrees with
    the tensors.

    Raises:
        DraftsmithError: naming the first missing or mismatched key and, for a mismatch, both values.
    """
    for key, value, implied in required_config_keys(drafter, config):
        if value is ...:
            hint = f" (the weights imply {implied})" if implied is not None else ""
            raise DraftsmithError(
                f"{where}/config.json lacks {key!r}{hint}; serving engines read it to build the "
                f"{drafter.format} drafter and would fall back to a default. Re-export it "
                "(`draftsmith export ... --format " f"{drafter.format}`) or add the key")
        if implied is not None and value != implied:
            raise DraftsmithError(
                f"{where}/config.json has {key}={value} but the weights imply {implied}; fix "
                "config.json or re-export the drafter")
