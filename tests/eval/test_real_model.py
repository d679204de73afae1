"""On the real SmolLM2-135M (fp32): every proposer reproduces plain greedy decoding, and the
`draftsmith eval` command writes its table, JSON and plots."""

import copy
import json

import pytest
import torch

from draftsmith.cli import main
from draftsmith.decoding.decode import generate
from draftsmith.decoding.proposers.base import NoDraftProposer
from draftsmith.decoding.proposers.draft_model import DraftModelProposer, DraftModelTreeProposer
from draftsmith.decoding.proposers.prompt_lookup import PromptLookupProposer
from draftsmith.decoding.proposers.tree_expansion import DEFAULT_CHOICES, DynamicTreeConfig
from draftsmith.decoding.runner import CausalLMRunner
from draftsmith.drafter_folder import DRAFTER_CONFIG
from draftsmith.target.chat import chat_input_ids
from draftsmith.target.load import load_target
from draftsmith.train.joint import wrap_with_lora
from tests.helpers.export_helpers import build_drafter, write_checkpoint
from tests.helpers.state import require_offline_model

pytestmark = [pytest.mark.real_model, pytest.mark.slow]
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


def test_eval_runs_several_named_drafters_in_one_run(tmp_path):
    """EAGLE-1 weights as EAGLE-1 (static) and EAGLE-2 (dynamic), and a Medusa-2 drafter whose
    LoRA adapter is merged into a copy of the target: the original target stays untouched, so the
    feature drafter reproduces plain greedy output exactly (fp32) after Medusa-2 has run."""
    require_offline_model(NAME)
    target = load_target(NAME, dtype="float32").model
    eagle = write_checkpoint(tmp_path / "eagle1", "eagle1", build_drafter("eagle1", target),
                             target)
    medusa = write_checkpoint(tmp_path / "medusa2", "medusa",
                              build_drafter("medusa", target), target)
    meta = json.loads((medusa / DRAFTER_CONFIG).read_text())
    meta["lora"] = True
    (medusa / DRAFTER_CONFIG).write_text(json.dumps(meta))
    peft = wrap_with_lora(copy.deepcopy(target), build_drafter("medusa", target).config)
    for name, param in peft.named_parameters():
        if "lora_B" in name:
            param.data.normal_(0, 0.05)
    peft.save_pretrained(medusa / "lora", safe_serialization=True)

    methods = "plain,drafter@m2,drafter_static@e1,drafter_dynamic@e1"
    code = main(["eval", "--target", NAME, "--dtype", "float32", "--bench", "gsm8k",
                 "--limit", "1", "--max-new-tokens", "16", "--methods", methods,
                 "--drafter", f"e1={eagle}", "--drafter", f"m2={medusa}",
                 "--tree-depth", "3", "--tree-total-tokens", "6", "--out", str(tmp_path / "ev")])
    assert code == 0
    payload = json.loads((tmp_path / "ev" / "eval.json").read_text())
    rows = payload["summary"]["all"]
    assert list(rows) == methods.split(",")
    assert rows["drafter_static@e1"]["identical_to_plain"] == 1.0
    assert rows["drafter_dynamic@e1"]["identical_to_plain"] == 1.0
    assert rows["drafter@m2"]["identical_to_plain"] == 0.0, "decodes with the LoRA-merged copy"
    assert payload["drafters"]["m2"]["lora_merged"] and payload["drafters"]["e1"]["kind"] == "eagle1"
    assert payload["tree_budgets"] == {}


def test_eval_cli_sizes_the_tree_for_this_machine(tmp_path):
    """--tree-total-tokens auto: the autotuner decodes calibration prompts from every set, and
    the run decodes with the depth and size it chose (greedy: from the accepted paths)."""
    require_offline_model(NAME)
    target = load_target(NAME, dtype="float32").model
    eagle = write_checkpoint(tmp_path / "eagle1", "eagle1", build_drafter("eagle1", target),
                             target)
    code = main(["eval", "--target", NAME, "--dtype", "float32", "--bench", "gsm8k,humaneval",
                 "--limit", "3", "--max-new-tokens", "8", "--methods", "plain,drafter_dynamic@e1",
                 "--drafter", f"e1={eagle}", "--tree-topk", "3", "--tree-total-tokens", "auto",
                 "--out", str(tmp_path / "ev")])
    assert code == 0
    payload = json.loads((tmp_path / "ev" / "eval.json").read_text())
    budget = payload["tree_budgets"]["drafter_dynamic@e1"]
    chosen = f"{budget['depth']},{budget['total_tokens']}"
    assert chosen == max(budget["expected_tokens_per_second"],
                         key=budget["expected_tokens_per_second"].get)
    assert budget["expected_tau"][chosen] >= 1.0
    calibrated = budget["calibration_prompts"]
    assert len(calibrated) == 4 and {name.split("/")[0] for name in calibrated} == {
        "gsm8k", "humaneval"}, calibrated  # 4 of the 6 prompts, from both sets
    assert payload["summary"]["all"]["drafter_dynamic@e1"]["identical_to_plain"] == 1.0


def test_eval_cli_names_a_missing_drafter_label(capsys):
    assert main(["eval", "--methods", "plain,drafter@nope", "--drafter", "e1=somewhere"]) == 2
    err = capsys.readouterr().err
    assert "'nope'" in err and "--drafter nope=DIR" in err


def test_prompt_file_and_lossless_gate(tmp_path, capsys, monkeypatch):
    """--prompts FILE reports per category; --check-lossless passes on lossless methods and
    fails, naming the first divergent token, when a method's output differs from plain."""
    require_offline_model(NAME)
    prompts = tmp_path / "question.jsonl"
    prompts.write_text('{"question_id": 1, "category": "qa", "turns": ["What is 2+2?"]}\n'
                       '{"question_id": 2, "category": "math", "turns": ["Count to five."]}\n')
    args = ["eval", "--target", NAME, "--prompts", str(prompts), "--methods",
            "plain,prompt_lookup", "--max-new-tokens", "12", "--check-lossless"]
    assert main([*args, "--out", str(tmp_path / "ok")]) == 0
    payload = json.loads((tmp_path / "ok" / "eval.json").read_text())
    assert set(payload["summary"]) == {"qa", "math", "all"}
    check = payload["lossless_check"]
    assert check.pop("guarantee").startswith("float32 on the CPU")
    assert check == {"greedy": True, "dtype_exact": True, "checked": ["prompt_lookup"],
                     "failures": []}
    assert "lossless check passed" in capsys.readouterr().out

    from draftsmith.eval import executor

    original = executor.MethodExecutor.run

    def corrupt(self, method, prompt_ids, *rest, **kwargs):
        tokens, record = original(self, method, prompt_ids, *rest, **kwargs)
        return ([*tokens[:3], tokens[3] + 1, *tokens[4:]] if method == "prompt_lookup"
                else tokens), record

    monkeypatch.setattr(executor.MethodExecutor, "run", corrupt)
    assert main([*args, "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "lossless check failed: prompt_lookup diverged from plain decoding on" in err
    assert "at new token 3" in err and "Traceback" not in err
