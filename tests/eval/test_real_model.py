"""On the real SmolLM2-135M (fp32): every proposer reproduces plain greedy decoding, and the
`draftsmith eval` command writes its table, JSON and plots."""

import json

import pytest
import torch

from draftsmith.chat import chat_input_ids
from draftsmith.cli import main
from draftsmith.eval.decode import generate
from draftsmith.eval.proposers.base import NoDraftProposer
from draftsmith.eval.proposers.draft_model import DraftModelProposer, DraftModelTreeProposer
from draftsmith.eval.proposers.prompt_lookup import PromptLookupProposer
from draftsmith.eval.proposers.tree_expansion import DEFAULT_CHOICES, DynamicTreeConfig
from draftsmith.eval.runner import CausalLMRunner
from draftsmith.target import load_target

from conftest import require_offline_model

pytestmark = pytest.mark.real_model
NAME = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def smollm():
    require_offline_model(NAME)
    return load_target(NAME, dtype="float32")


def test_every_proposer_is_lossless_on_smollm2(smollm):
    # a bf16 copy is a real, imperfect draft model with the same tokenizer
    draft = load_target(NAME, dtype="bfloat16").model
    prompt = chat_input_ids(smollm.tokenizer, "List three uses of a paperclip.")[0].tolist()
    runner = CausalLMRunner(smollm.model)
    reference = generate(runner, NoDraftProposer(), prompt, 40, smollm.eos_token_ids).tokens
    hf = smollm.model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False,
                               eos_token_id=smollm.eos_token_ids, pad_token_id=0)
    assert reference == hf[0, len(prompt):].tolist()
    proposers = {
        "prompt_lookup": PromptLookupProposer(),
        "chain": DraftModelProposer(draft, 4),
        "static_tree": DraftModelTreeProposer(draft, DEFAULT_CHOICES),
        "dynamic_tree": DraftModelTreeProposer(draft, dynamic=DynamicTreeConfig(3, 5, 12)),
    }
    for name, proposer in proposers.items():
        result = generate(runner, proposer, prompt, 40, smollm.eos_token_ids)
        assert result.tokens == reference, name
        if name != "prompt_lookup":
            assert result.tau > 1.5, f"{name}: a bf16 copy of the target should be accepted often"


def test_eval_cli_writes_table_json_and_plots(tmp_path, capsys):
    require_offline_model(NAME)
    code = main(["eval", "--target", NAME, "--bench", "gsm8k,mt_bench", "--limit", "1",
                 "--max-new-tokens", "12", "--methods", "plain,prompt_lookup,hf_generate",
                 "--out", str(tmp_path)])
    assert code == 0
    payload = json.loads((tmp_path / "eval.json").read_text())
    assert set(payload["summary"]) == {"gsm8k", "mt_bench", "all"}
    assert payload["summary"]["all"]["plain"]["speedup"] == 1.0
    turns = {(r["set_name"], r["turn"]) for r in payload["records"]}
    assert ("mt_bench", 1) in turns, "MT-bench's second turn is evaluated"
    assert (tmp_path / "acceptance_by_depth.png").stat().st_size > 0
    assert (tmp_path / "speedup_by_set.png").stat().st_size > 0
    assert "prompt_lookup" in capsys.readouterr().out


def test_eval_cli_rejects_draft_methods_without_a_draft_model(capsys):
    assert main(["eval", "--methods", "plain,draft_model"]) == 2
    assert "--draft-model" in capsys.readouterr().err
