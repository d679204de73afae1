"""Which int8 form of the target verifies fastest on this CPU: forward time of n new tokens on a
cached context (n = 1 is plain decoding's step, n > 1 a verification forward) for the float32
target and its int8 copies, with and without the output head quantized, plus how often each
copy's greedy choice agrees with float32's (teacher-forced on the built-in prompts).

Candidates: float32 as `draftsmith eval` runs it (few-row linears installed), torch's built-in
`torch.ao.quantization.quantize_dynamic` (draftsmith.target.quantize's `int8`), and, where torchao is
installed (`pip install torchao`; not a draftsmith dependency), torchao's eager int8 weight-only
form (its dynamic-activation form was several times slower than float32 in a first probe here,
so it is left out: one 16-token forward took seconds).
Writes benchmarks/quantized_target/<target>.json. Usage:
    .venv/bin/python benchmarks/quantized_target/bench_quantized_target.py \
        [--target smollm2-135m-instruct]
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
from pathlib import Path

import torch

from draftsmith.decoding.runner import CausalLMRunner
from draftsmith.eval.autotune import measure_verify_cost
from draftsmith.eval.prompts.sets import load_prompts
from draftsmith.files import write_json
from draftsmith.provenance import git_commit
from draftsmith.target.chat import render_chat
from draftsmith.target.load import load_target
from draftsmith.target.precision import describe_hardware, hardware_record
from draftsmith.target.quantize import quantize_model

SIZES = (1, 2, 4, 8, 16)


def torchao_weight_only(model: torch.nn.Module, quantize_head: bool):
    """torchao's eager int8 weight-only form, or None without torchao."""
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError:
        return None
    quantized = copy.deepcopy(model)
    head = quantized.get_output_embeddings()
    if quantize_head:
        head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=False)
    quantize_(quantized, Int8WeightOnlyConfig(), filter_fn=lambda m, fqn: isinstance(
        m, torch.nn.Linear) and (quantize_head or m is not head))
    return quantized


# linears left float in the per-layer variants of the dynamic int8 form (Llama / Qwen2 names):
# where its agreement with float32 is lost
KEEP_FLOAT = {"-down": ("down_proj",), "-mlp": ("down_proj", "gate_proj", "up_proj"),
              "-attn": ("q_proj", "k_proj", "v_proj", "o_proj")}


def candidates(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """float32, draftsmith's int8 (torch.ao dynamic) and torchao's int8 weight-only; each int8
    one with the output head float32 and quantized (`+head`); and the dynamic form with the MLP
    output projection, the whole MLP, or attention kept float (`-down`, `-mlp`, `-attn`)."""
    models = {"float32": model}
    for head in (False, True):
        suffix = "+head" if head else ""
        models[f"int8_torch_ao_dynamic{suffix}"] = quantize_model(
            model, "int8", quantize_head=head).model
        quantized = torchao_weight_only(model, head)
        if quantized is not None:
            models[f"torchao_int8_weight_only{suffix}"] = quantized
    for suffix, keep in KEEP_FLOAT.items():
        models[f"int8_torch_ao_dynamic{suffix}"] = quantize_model(model, "int8",
                                                                  keep_float=keep).model
    return models


@torch.inference_mode()
def greedy_agreement(reference: torch.nn.Module, model: torch.nn.Module, texts) -> float:
    """Share of positions where the model's argmax equals the reference's (teacher-forced)."""
    same = total = 0
    for ids in texts:
        batch = torch.tensor([ids])
        a = reference(batch).logits[0].argmax(-1)  # (T,)
        b = model(batch).logits[0].argmax(-1)
        same += int((a == b).sum())
        total += a.numel()
    return same / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--context", type=int, default=200, help="cached tokens before the forward")
    parser.add_argument("--rounds", type=int, default=2, help="passes over every candidate")
    parser.add_argument("--repeats", type=int, default=2, help="timings per size and pass")
    parser.add_argument("--out", default="benchmarks/quantized_target")
    args = parser.parse_args()

    target = load_target(args.target, dtype="float32")
    vocab = target.model.get_output_embeddings().weight.shape[0]
    models = candidates(target.model)
    texts = [render_chat(target.tokenizer, [{"role": "user", "content": p.turns[0]}])[:96]
             for s in ("mt_bench", "humaneval", "gsm8k") for p in load_prompts(s, 2)]
    runners = {name: CausalLMRunner(m) for name, m in models.items()}
    ms: dict[str, dict[int, float]] = {name: {} for name in models}
    for rounds in range(args.rounds):  # alternate candidates so a busy machine's drift hits them all
        for name, runner in runners.items():
            costs = measure_verify_cost(runner, list(SIZES), args.context, args.repeats,
                                        vocab_size=vocab, reduce=min)
            for n, seconds in costs.items():
                ms[name][n] = min(seconds * 1e3, ms[name].get(n, float("inf")))
            print(f"pass {rounds + 1}: {name} "
                  + " ".join(f"{n}:{seconds * 1e3:.0f}ms" for n, seconds in costs.items()),
                  flush=True)
    print("greedy agreement with float32 ...", flush=True)
    agreement = {name: greedy_agreement(target.model, m, texts) for name, m in models.items()}
    base = ms["float32"]
    machine = hardware_record("cpu", target.dtype_choice)
    payload = {
        "hardware": describe_hardware(machine), "machine": machine,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(), "torch": torch.__version__, "target": args.target,
        "load_average_1_5_15_min": [round(x, 2) for x in os.getloadavg()],
        "torch_threads": torch.get_num_threads(), "context_len": args.context, "timings_per_size": args.rounds * args.repeats,
        "note": "minimum over the timings; float32 is the GGUF's weights dequantized by "
                "transformers, with draftsmith's few-row linears as eval runs it",
        "forward_ms": {name: {str(n): round(v, 2) for n, v in c.items()} for name, c in ms.items()},
        "speed_vs_float32": {name: {str(n): round(base[n] / v, 3) for n, v in c.items()}
                             for name, c in ms.items()},
        "greedy_agreement_with_float32": {name: round(a, 4) for name, a in agreement.items()},
    }
    path = write_json(Path(args.out) / f"{args.target}.json", payload, indent=1)
    print(f"{payload['hardware']}; {len(texts)} prompts for agreement")
    print(f"{'candidate':26s} " + " ".join(f"{'n=' + str(n):>8s}" for n in SIZES) + "  agree")
    for name, c in ms.items():
        print(f"{name:26s} " + " ".join(f"{c[n]:6.1f}ms" for n in SIZES)
              + f"  {agreement[name]:.3f}")
    print(f"results: {path}")


if __name__ == "__main__":
    main()
