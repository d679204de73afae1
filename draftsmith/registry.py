"""The one place that names every drafter kind: how to build and train it, which target hidden
states it reads, how it decodes, which of its tensors are frozen copies of the target's, and its
display name, and what it can do (capability flags: `uses_draft_vocab`, `reads_aux_layers`,
`engine_methods`, ...). Data, training, evaluation, export and the benchmark ask this table; none
of them keeps a kind table or branches on a kind name, so a new kind is one model module
(`models/contracts.py` says what the module offers), one entry here and its export format
(`export/formats.py`); a new decoding family is one proposer module that registers itself
(`decoding/proposers/base.py`). The registry imports only `models/`.

EAGLE-2 is not a kind: it is an EAGLE-1 drafter decoded with a dynamic tree.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from draftsmith.config_values import build_dataclass
from draftsmith.errors import DraftsmithError
from draftsmith.models.block_loss import collate_block_rows, dflash_loss
from draftsmith.models.contracts import DrafterModule
from draftsmith.models.dflash import DFlashConfig, DFlashDrafter, dflash_layer_ids
from draftsmith.models.dspark import DSparkConfig, DSparkDrafter, dspark_loss
from draftsmith.models.eagle1 import Eagle1Config, Eagle1Drafter, eagle1_loss
from draftsmith.models.eagle3 import (
    Eagle3Config,
    Eagle3Drafter,
    collate_ttt_rows,
    eagle3_layer_ids,
    eagle3_loss,
)
from draftsmith.models.features import Features
from draftsmith.models.medusa import MedusaConfig, MedusaHeads, medusa_loss
from draftsmith.models.mtp import MTPConfig, MTPDrafter, mtp_loss
from draftsmith.models.peagle import (
    PEagleConfig,
    PEagleDrafter,
    collate_cod_rows,
    peagle_loss,
)
from draftsmith.models.target_states import hidden_indices
from draftsmith.models.target_support import HEAD_FIELDS, LAYER_FIELDS, check_target_supported


@dataclass(frozen=True)
class DrafterSpec:
    """How one drafter kind is built and trained.

    Attributes:
        kind: registry name.
        title: display name (model cards, reports): "EAGLE-3".
        description: one line for `--help` and errors.
        config_cls: its config dataclass (built from the recipe's `drafter:` section).
        build: (target config, config) -> module.
        aux_layers: (num target layers, config) -> 0-based layer outputs it needs besides the
            last hidden state.
        loss: (module, Features) -> (loss, metrics with `acc_{k}` per draft position).
        proposer: the decoding family its proposer is built by (`register_family` in
            `decoding/proposers/`): `feature` (autoregressive on features: EAGLE), `heads`
            (parallel heads: Medusa), `modules` (chained MTP) or `block` (one forward per
            block: DFlash, DSpark).
        tree_shapes: the tree shapes it decodes with (`chain`, `static`, `dynamic`), default first.
        drafts_in_one_forward: one drafter forward drafts every depth of a step (DFlash, DSpark,
            P-EAGLE), so drafting costs the same at any depth: the tree autotuner prices it so.
        frozen_prefixes: parameter-name prefixes that are frozen copies of the target's tensors
            (not trained, may be left out of a saved drafter and taken from the target).
        uses_draft_vocab: its head covers a reduced draft vocabulary (EAGLE-3's d2t / t2d).
        trains_target: (config) -> whether the target trains with it through LoRA (Medusa-2).
        custom_aux_layers: (config) -> the layer outputs its recipe chose instead of the default
            (EAGLE-3 `layer_ids`), or None; the hidden-state cache stores them too.
        reads_aux_layers: it fuses target layer outputs, whose ids its exports must record
            (serving engines assume a default when they are missing).
        engine_methods: serving engine -> the name it serves this kind under (`vllm`: the
            speculative config's `method`, `sglang`: `--speculative-algorithm`, `llama.cpp`:
            `--spec-type`); export to GGUF and serve-check need the engine listed.
        engine_options: engine -> the keys its speculative config needs besides the method
            (P-EAGLE in vLLM: `parallel_drafting`; without it vLLM drafts autoregressively and
            skips `mask_hidden`, another drafter than the one trained).
        unserved_by: (config) -> engine -> why that engine cannot serve a drafter with these
            settings although it serves the kind (EAGLE-3.1 in llama.cpp); export to GGUF and
            serve-check refuse with that message.
        target_fields: the target config fields its module reads when built (a target whose
            config lacks one, GPT-2's intermediate_size, is refused by `check_target`).
        collate_rows: (config, seed, input_ids, attention_mask, loss_mask) -> named index
            tensors its loss needs whose sizes depend on the data (EAGLE-3's packed TTT rows,
            P-EAGLE's COD draw): made by the training collate on the host, so the step reads
            none from the device; they reach the loss as `Features.kind_rows`. A module-level
            function (loader workers pickle it).
        packs: its loss keeps attention and labels within each document of a packed row
            (`train.batching: packed`, `train/packing.py`); its `collate_rows` takes them
            (`documents=`).
    """

    kind: str
    title: str
    description: str
    config_cls: type
    build: Callable[[object, object], DrafterModule]
    aux_layers: Callable[[int, object], list[int]]
    loss: Callable[[nn.Module, Features], tuple[torch.Tensor, dict[str, torch.Tensor]]]
    proposer: str
    tree_shapes: tuple[str, ...]
    drafts_in_one_forward: bool = False
    frozen_prefixes: tuple[str, ...] = ()
    uses_draft_vocab: bool = False
    trains_target: Callable[[object], bool] = lambda config: False
    custom_aux_layers: Callable[[object], list[int] | None] = lambda config: None
    reads_aux_layers: bool = False
    engine_methods: dict[str, str] = field(default_factory=dict)
    engine_options: dict[str, dict] = field(default_factory=dict)
    unserved_by: Callable[[object], dict[str, str]] = lambda config: {}
    target_fields: tuple[str, ...] = LAYER_FIELDS
    collate_rows: Callable[..., dict[str, torch.Tensor]] | None = None
    packs: bool = False

    @property
    def default_tree(self) -> str:
        return self.tree_shapes[0]

    def hidden_indices(self, num_layers: int, config=None) -> tuple[int, ...]:
        """`hidden_states` indices it reads (see models/features.py), the last hidden state last.

        Args:
            num_layers: the target's decoder layer count N.
            config: its config (custom `layer_ids`); None = the kind's defaults.
        """
        config = config if config is not None else self.make_config()
        return hidden_indices(num_layers, self.aux_layers(num_layers, config))

    def check_target(self, model, target: str = "the target") -> None:
        """Refuse a target (a loaded causal LM, or only its config) this kind cannot be built for
        or read hidden states of, naming the supported architectures (models/target_support.py)."""
        config = getattr(model, "config", model)
        decoder = model.get_decoder() if isinstance(model, nn.Module) else None
        check_target_supported(self.title, self.target_fields, config, decoder, target)

    def make_config(self, values: dict | None = None):
        """Build the config dataclass from a dict; unknown keys are an error listing valid ones."""
        try:
            return build_dataclass(self.config_cls, dict(values or {}), "drafter")
        except ValueError as err:
            raise DraftsmithError(f"drafter settings for {self.kind!r}: {err}") from err


EAGLE31_NOT_IN_LLAMA_CPP = (
    "EAGLE-3.1 (drafter.fc_norm / drafter.norm_output) is not served by llama.cpp: its EAGLE-3 "
    "GGUF converter and `--spec-type draft-eagle3` read norm_before_fc and norm_before_residual "
    "but neither fc_norm weights nor norm_output (llama.cpp in xllamacpp 2026.10.11549), so it "
    "would serve another drafter; serve it with vLLM (`draftsmith export CKPT --format "
    "speculators`, `draftsmith serve-check EXPORT --engine vllm`) or SGLang (`--format eagle3`), "
    "or train with fc_norm: false and norm_output: false for llama.cpp")

EAGLE1_BIASED_FC_NOT_IN_VLLM = (
    "its fc has a trained bias (drafter.fc_bias), which vLLM's EAGLE loader "
    "(EagleLlamaForCausalLM, vLLM 0.32 and 0.33) drops: it builds fc without one, so vLLM would "
    "serve a different drafter. Serve it with SGLang (`--speculative-algorithm EAGLE`), or "
    "retrain with `drafter.fc_bias: false` (the default) for vLLM")

DFLASH_DRAFT_VOCAB_NOT_IN = {
    engine: (f"it drafts over a reduced draft vocabulary (drafter.draft_vocab_size: its own "
             f"head of Vd rows and d2t), which {reader}, so {name} would draft with the target's "
             "full head: another drafter than the one trained and evaluated. Serve it with vLLM "
             "(`--format dflash` or `dflash-speculators`: vLLM loads d2t and the reduced head), "
             f"or retrain with the full vocabulary (drafter.draft_vocab_size unset) for {name}")
    for engine, name, reader in (
        ("sglang", "SGLang", "SGLang's DFlash (0.5.23, models/dflash.py) ignores: it declares "
                             "no draft head and skips d2t"),
        ("llama.cpp", "llama.cpp", "llama.cpp's DFlash GGUF converter (xllamacpp 2026.10.11549) "
                                   "drops"))}


def block_aux_layers(num_layers: int, config) -> list[int]:
    """The target layer outputs a block drafter (DFlash, DSpark) fuses."""
    return config.target_layer_ids or dflash_layer_ids(num_layers, config.num_layers)


def block_custom_layers(config) -> list[int] | None:
    """A block drafter recipe's own `target_layer_ids`, or None for the default."""
    return list(config.target_layer_ids) if config.target_layer_ids else None


DRAFTERS: dict[str, DrafterSpec] = {
    spec.kind: spec
    for spec in (
        DrafterSpec(
            kind="medusa",
            title="Medusa",
            description="Medusa heads on the last hidden state (Medusa-1; lora: true = Medusa-2)",
            config_cls=MedusaConfig,
            build=MedusaHeads,
            aux_layers=lambda n, cfg: [],
            loss=lambda m, f: medusa_loss(m, f.input_ids, f.loss_mask, f.last_hidden,
                                          f.logits_after, f.position_ids),
            packs=True,
            proposer="heads",
            tree_shapes=("static", "chain"),
            frozen_prefixes=("lm_head.",),  # shared_head: the target's output layer
            trains_target=lambda cfg: bool(cfg.lora),
            engine_methods={"vllm": "medusa"},  # vLLM up to 0.32: 0.33 removed Medusa
            target_fields=HEAD_FIELDS,
        ),
        DrafterSpec(
            kind="eagle1",
            title="EAGLE-1/2",
            description="EAGLE-1 feature drafter (decode with a dynamic tree for EAGLE-2)",
            config_cls=Eagle1Config,
            build=Eagle1Drafter,
            aux_layers=lambda n, cfg: [],
            loss=lambda m, f: eagle1_loss(m, f.input_ids, f.attention_mask, f.loss_mask,
                                          f.last_hidden, f.logits_after, f.document_ids,
                                          f.position_ids),
            packs=True,
            proposer="feature",
            tree_shapes=("static", "chain", "dynamic"),
            frozen_prefixes=("embed_tokens.", "lm_head."),
            engine_methods={"vllm": "eagle", "sglang": "EAGLE"},
            unserved_by=lambda cfg: {"vllm": EAGLE1_BIASED_FC_NOT_IN_VLLM} if cfg.fc_bias else {},
        ),
        DrafterSpec(
            kind="eagle3",
            title="EAGLE-3",
            description="EAGLE-3: fused low/mid/high features, training-time test, draft vocab",
            config_cls=Eagle3Config,
            build=Eagle3Drafter,
            aux_layers=lambda n, cfg: cfg.layer_ids or eagle3_layer_ids(n),
            loss=lambda m, f: eagle3_loss(m, f.input_ids, f.attention_mask, f.loss_mask,
                                          f.aux_hidden, f, f.kind_rows or None, f.document_ids,
                                          f.position_ids),
            collate_rows=collate_ttt_rows,
            packs=True,
            proposer="feature",
            tree_shapes=("dynamic", "chain", "static"),
            frozen_prefixes=("embed_tokens.",),
            uses_draft_vocab=True,
            custom_aux_layers=lambda cfg: list(cfg.layer_ids) if cfg.layer_ids else None,
            reads_aux_layers=True,
            engine_methods={"vllm": "eagle3", "sglang": "EAGLE3", "llama.cpp": "draft-eagle3"},
            unserved_by=lambda cfg: {"llama.cpp": EAGLE31_NOT_IN_LLAMA_CPP} if cfg.eagle31 else {},
        ),
        DrafterSpec(
            kind="peagle",
            title="P-EAGLE",
            description="P-EAGLE: EAGLE-3 drafting every depth in one forward (parallel slots)",
            config_cls=PEagleConfig,
            build=PEagleDrafter,
            aux_layers=lambda n, cfg: cfg.layer_ids or eagle3_layer_ids(n),
            loss=lambda m, f: peagle_loss(m, f.input_ids, f.attention_mask, f.loss_mask,
                                          f.aux_hidden, f, f.kind_rows or None, f.document_ids,
                                          f.position_ids),
            collate_rows=collate_cod_rows,
            packs=True,
            proposer="parallel",
            tree_shapes=("dynamic", "chain"),
            drafts_in_one_forward=True,
            frozen_prefixes=("embed_tokens.",),
            uses_draft_vocab=True,
            custom_aux_layers=lambda cfg: list(cfg.layer_ids) if cfg.layer_ids else None,
            reads_aux_layers=True,
            engine_methods={"vllm": "eagle3"},
            engine_options={"vllm": {"parallel_drafting": True}},
        ),
        DrafterSpec(
            kind="mtp",
            title="MTP",
            description="DeepSeek-V3-style multi-token prediction modules (chain drafts)",
            config_cls=MTPConfig,
            build=MTPDrafter,
            aux_layers=lambda n, cfg: [],
            loss=lambda m, f: mtp_loss(m, f.input_ids, f.attention_mask, f.loss_mask,
                                       f.last_hidden, f.logits_after, f.document_ids,
                                       f.position_ids),
            packs=True,
            proposer="modules",
            tree_shapes=("chain",),
            frozen_prefixes=("embed_tokens.", "lm_head."),
        ),
        DrafterSpec(
            kind="dflash",
            title="DFlash",
            description="DFlash block drafter: one forward proposes a block from fused features",
            config_cls=DFlashConfig,
            build=DFlashDrafter,
            aux_layers=block_aux_layers,
            loss=dflash_loss,
            collate_rows=collate_block_rows,
            packs=True,
            proposer="block",
            tree_shapes=("chain", "dynamic"),
            drafts_in_one_forward=True,
            frozen_prefixes=("embed_tokens.", "lm_head."),
            uses_draft_vocab=True,
            custom_aux_layers=block_custom_layers,
            reads_aux_layers=True,
            engine_methods={"vllm": "dflash", "sglang": "DFLASH", "llama.cpp": "draft-dflash"},
            unserved_by=lambda cfg: dict(DFLASH_DRAFT_VOCAB_NOT_IN) if cfg.draft_vocab_size
            else {},
        ),
        DrafterSpec(
            kind="dspark",
            title="DSpark",
            description="DSpark block drafter: DFlash with shifted labels, Markov and confidence "
                        "heads",
            config_cls=DSparkConfig,
            build=DSparkDrafter,
            aux_layers=block_aux_layers,
            loss=dspark_loss,
            collate_rows=functools.partial(collate_block_rows, label_shift=1),
            packs=True,
            proposer="block",
            tree_shapes=("chain", "dynamic"),
            drafts_in_one_forward=True,
            frozen_prefixes=("embed_tokens.", "lm_head."),
            custom_aux_layers=block_custom_layers,
            reads_aux_layers=True,
            engine_methods={"vllm": "dspark", "sglang": "DSPARK", "llama.cpp": "draft-dspark"},
        ),
    )
}


def served_by(engine: str) -> list[str]:
    """Titles of the kinds `engine` serves (for messages)."""
    return [spec.title for spec in DRAFTERS.values() if engine in spec.engine_methods]


def get_spec(kind: str) -> DrafterSpec:
    """Raises DraftsmithError for an unknown kind, listing the registered ones."""
    if kind not in DRAFTERS:
        raise DraftsmithError(f"unknown drafter kind {kind!r}; choose one of: {', '.join(DRAFTERS)}")
    return DRAFTERS[kind]
