"""Checks that an exported drafter fits a target before anything is decoded: hidden size, vocab,
draft vocab and (EAGLE-3) the target layers it fuses, and that its config.json carries every key
the serving engines of its format read. Every error names both values.

Train/serve mismatches are the usual reason a good drafter serves badly (REFERENCE.md section 4):
a wrong layer id silently costs most of the acceptance, so it is an error here, not a warning.
"""

from __future__ import annotations

from itertools import pairwise

from draftsmith.errors import DraftsmithError
from draftsmith.export.config_keys import MISSING
from draftsmith.export.record import ExportedDrafter, ExportFormat
from draftsmith.models.dflash import resolve_mask_token
from draftsmith.registry import get_spec


def check_layer_ids(ids: list[int], num_layers: int, where: str, servable: bool = True,
                    count: int | None = 3) -> None:
    """Aux layer ids: `count` (EAGLE-3: three; None: any number) 0-based layer outputs inside the
    target; for serving also strictly increasing, because vLLM and SGLang capture each layer
    once, in layer order.

    Raises:
        DraftsmithError: naming the ids and the target's layer count.
    """
    if count is not None and len(ids) != count:
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
        DraftsmithError: hidden size, vocab, draft vocab, layer ids or MTP numbering mismatch,
            or settings the drafter cannot be built with (a block size below 2, a mask token
            outside the vocabulary), with the message `eval` gives.
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
    spec = get_spec(drafter.kind)
    try:  # the settings `eval` builds the drafter from: refused here as there (block_size 0 ...)
        spec.make_config(drafter.settings)
        if drafter.settings.get("mask_token_id") is not None:
            resolve_mask_token(target_config, drafter.settings["mask_token_id"])
    except DraftsmithError as err:
        raise DraftsmithError(f"{where}: {err}") from err
    if spec.reads_aux_layers and drafter.aux_layer_ids:
        # the count is the reader's business (EAGLE-3: 3; block drafters: any)
        check_layer_ids(drafter.aux_layer_ids, layers, where, servable=False, count=None)
    if drafter.mtp_first_layer is not None and drafter.mtp_first_layer not in (0, layers):
        raise DraftsmithError(
            f"{where}: the MTP modules are numbered from layer {drafter.mtp_first_layer} but the "
            f"target has num_hidden_layers={layers} (the DeepSeek-V3 layout numbers the first "
            "module N, SGLang's NextN layout 0)")


def check_config_keys(drafter: ExportedDrafter, config: dict, where: str,
                      export_format: ExportFormat) -> None:
    """Every config.json key the engines of the drafter's format read (`export_format.config_keys`)
    is present and agrees with the tensors.

    Raises:
        DraftsmithError: naming the first missing or mismatched key and, for a mismatch, both values.
    """
    for key, value, implied in export_format.config_keys(drafter, config):
        if value is MISSING:
            hint = f" (the weights imply {implied})" if implied is not None else ""
            raise DraftsmithError(
                f"{where}/config.json lacks {key!r}{hint}; serving engines read it to build the "
                f"{drafter.format} drafter and would fall back to a default. Re-export it "
                "(`draftsmith export ... --format " f"{drafter.format}`) or add the key")
        if implied is not None and value != implied:
            raise DraftsmithError(
                f"{where}/config.json has {key}={value} but the weights imply {implied}; fix "
                "config.json or re-export the drafter")
