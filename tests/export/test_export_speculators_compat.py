"""A peer loads draftsmith's speculators-format EAGLE-3 export: `speculators.Eagle3DraftModel`
(vllm-project/speculators, the format vLLM serves) reads the folder and computes the same draft
logits as draftsmith, for the first step and for a training-time-test step on its own output.

speculators is not a draftsmith dependency; install it for this test with
    pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0
    pip install openai aiohttp httpx pydantic pydantic-settings loguru rich typer click psutil
(its declared dependencies pull CUDA torchvision/torchaudio, hence --no-deps).
"""

from __future__ import annotations

import pytest
import torch

from draftsmith.export import ExportOptions, export_drafter, load_exported
from draftsmith.models.layers import shift_left
from draftsmith.models.ttt_rows import ttt_masks
from tests.helpers.export_helpers import make_checkpoint

INSTALL = ("pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0 && pip install openai "
           "aiohttp httpx pydantic pydantic-settings loguru rich typer click psutil")

try:
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
except Exception as err:  # any import failure of the optional peer means: not installed here
    pytest.skip(f"speculators is not importable ({type(err).__name__}: {err}); install it with "
                f"`{INSTALL}`", allow_module_level=True)


def speculators_logits(model, aux: list[torch.Tensor], tokens: torch.Tensor, steps: int):
    """Draft logits of each TTT step, captured at speculators' lm_head."""
    captured: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda module, args, out: captured.append(out))
    try:
        with torch.no_grad():
            model(hidden_states=torch.cat(aux, dim=-1), input_ids=tokens,
                  document_ids=torch.zeros_like(tokens), ttt_steps=steps)
    finally:
        hook.remove()
    return captured


def draftsmith_logits(drafter, aux: list[torch.Tensor], tokens: torch.Tensor, steps: int):
    """The same unroll with draftsmith's drafter: step j feeds the tokens shifted by j, the
    previous step's output, positions + j (speculators starts positions at 1) and sees block 0
    causally plus its own position in later blocks."""
    t = tokens.shape[1]
    positions = 1 + torch.arange(t)[None]
    masks = ttt_masks(torch.ones_like(tokens), steps)
    hidden, cache, outputs = drafter.fuse(aux), [], []
    with torch.no_grad():
        for j in range(steps):
            hidden, logits, kv = drafter.step(shift_left(tokens, j), hidden, positions + j,
                                              masks[j], extra_kv=cache)
            cache.append(kv)
            outputs.append(logits)
    return outputs


def test_speculators_loads_the_export_and_computes_the_same_draft_logits(tmp_path):
    target, module, folder = make_checkpoint(tmp_path, "eagle3")
    verifier = tmp_path / "verifier"  # speculators reads the verifier's config and head from here
    target.save_pretrained(verifier)
    out = export_drafter(folder, "speculators", tmp_path / "export",
                         options=ExportOptions(base_model=str(verifier)))

    config = Eagle3SpeculatorConfig.from_pretrained(out)
    config.transformer_layer_config._attn_implementation = "eager"  # flex attention wants a GPU
    model = Eagle3DraftModel.from_pretrained(out, config=config).eval()
    assert model.config.eagle_aux_hidden_state_layer_ids == [1, 2, 3]
    assert torch.equal(model.d2t, module.d2t) and torch.equal(model.t2d, module.t2d)

    generator = torch.Generator().manual_seed(4)
    tokens = torch.randint(2, 128, (1, 12), generator=generator)
    aux = [torch.randn(1, 12, 32, generator=generator) for _ in range(3)]
    theirs = speculators_logits(model, aux, tokens, steps=2)
    reloaded = load_exported(out, target).module
    for ours in (draftsmith_logits(module, aux, tokens, 2), draftsmith_logits(reloaded, aux,
                                                                              tokens, 2)):
        assert len(ours) == len(theirs) == 2
        for step, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"TTT step {step}")
