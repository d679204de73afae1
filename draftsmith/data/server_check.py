"""Prove a server serves the target before it writes training data: the same tokenizer, the same
chat template, and the same model (its greedy answers are the target's own argmax choices).

Answers from another model would train a drafter for a model it will never run beside, and
nothing downstream would notice; so regeneration refuses to start unless all three hold:

1. Tokenizer: the server's `/tokenize` of a rendered probe conversation equals the target's ids
   (skipped where the server has no such route).
2. Template (chat endpoint): the server counts the probe conversation's prompt as exactly as many
   tokens as the target's chat template renders.
3. Weights: the server's greedy answers to three prompts, read by the target in one teacher-forced
   forward each, agree with the target's argmax on >= `MIN_AGREEMENT` of their tokens. A served
   copy in other kernels or a quantized copy agrees almost everywhere (llama.cpp's Q4_1 kernels
   against the transformers float32 load of the same GGUF: see the check's printed value); another
   model with the same tokenizer does not.
"""

from __future__ import annotations

import torch

from draftsmith.data.render import prompt_ids, render_text
from draftsmith.data.server_client import AGREEMENT_PROMPTS, PROBE, ChatServer, RequestRefused
from draftsmith.errors import DraftsmithError

MIN_AGREEMENT = 0.8
AGREEMENT_TOKENS = 24


def check_serves_target(server: ChatServer, model, tokenizer, template: str, name: str) -> dict:
    """Run the three checks; return what they measured (for the run's manifest).

    Raises:
        DraftsmithError: a check failed; the message says which and how to fix it.
    """
    where = f"the server at {server.shown(0)} (model {server.model!r})"
    fix = (f"point data.regenerate.base_url at a server that runs {name}, or set target.name to "
           "the model the server runs")
    text = render_text(tokenizer, PROBE, template, generation_prompt=True)
    local = tokenizer(text, add_special_tokens=False).input_ids
    served = server.tokenize(text)
    if served is not None and served != local:
        first = next((k for k, (a, b) in enumerate(zip(served, local, strict=False)) if a != b),
                     min(len(served), len(local)))
        raise DraftsmithError(
            f"{where} tokenizes differently from the target {name}: the probe conversation is "
            f"{len(served)} tokens there and {len(local)} here, first different at token {first}; "
            f"it serves another model. {fix}")
    record = {"tokenizer": "same ids" if served is not None else "no /tokenize route"}
    if server.endpoint == "chat":
        try:
            counted = server.prompt_tokens(PROBE)
        except RequestRefused as err:
            raise DraftsmithError(f"the server at {server.shown(0)} refused a probe request: "
                                  f"{err.reply_error}") from None
        if counted is not None and counted != len(local):
            raise DraftsmithError(
                f"{where} renders the probe conversation as {counted} tokens where the target's "
                f"chat template gives {len(local)}: it applies another chat template (or serves "
                "another model). Start the server with the target's template, or set "
                "data.regenerate.endpoint=completions to send the target's own token ids")
        record["template"] = "same prompt length" if counted is not None else "not reported"
    agreement = greedy_agreement(server, model, tokenizer, template)
    record["greedy_agreement"] = round(agreement, 4)
    if agreement < MIN_AGREEMENT:
        raise DraftsmithError(
            f"{where} answers unlike the target {name}: only {agreement:.0%} of its greedy tokens "
            f"on {len(AGREEMENT_PROMPTS)} probe prompts are the target's own top choice (a copy of "
            f"the target agrees on >= {MIN_AGREEMENT:.0%}); it serves another model. {fix}")
    return record


@torch.inference_mode()
def greedy_agreement(server: ChatServer, model, tokenizer, template: str) -> float:
    """Fraction of the server's greedy answer tokens that are the target's argmax given the same
    prefix (answers re-tokenized from their text; one forward per prompt)."""
    device = next(model.parameters()).device
    agree = total = 0
    for i, question in enumerate(AGREEMENT_PROMPTS):
        messages = [{"role": "user", "content": question}]
        prompt = prompt_ids(tokenizer, messages, template)
        reply = server.complete(i, messages, prompt, max_tokens=AGREEMENT_TOKENS,
                                temperature=0.0, top_p=1.0, seed=None)
        if reply.error:
            raise DraftsmithError(f"the server at {server.shown(0)} refused a probe request: "
                                  f"{reply.error}")
        answer = tokenizer(reply.text, add_special_tokens=False).input_ids[:AGREEMENT_TOKENS]
        if not answer:
            continue
        ids = torch.tensor([prompt + answer], device=device)
        choices = model(input_ids=ids).logits[0, len(prompt) - 1: -1].argmax(-1).tolist()
        agree += sum(int(a == c) for a, c in zip(answer, choices, strict=True))
        total += len(answer)
    return agree / total if total else 0.0
