"""Assistant-only loss masks, exact token by token, for ChatML (SmolLM2, Qwen2.5) and Llama-3."""

import pytest
from transformers import AutoTokenizer

from draftsmith.data.conversations import Conversation
from draftsmith.data.render import (
    RenderStats,
    render_conversations,
    render_messages,
    resolve_chat_template,
)
from draftsmith.errors import DraftsmithError
from draftsmith.target import offline_models
from tests.helpers.state import require_offline_model
from tests.helpers.tiny_tokenizers import (
    CHATML_QWEN25,
    CHATML_SMOLLM2,
    LLAMA3,
    LLAMA3_SPECIALS,
    char_tokenizer,
    with_template,
)

SYSTEM = {"role": "system", "content": "Be brief."}
TURNS = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello there!"},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "It is 4, of course."},
]


@pytest.fixture(scope="module")
def smollm_tokenizer():
    name = require_offline_model("smollm2-135m-instruct")
    return AutoTokenizer.from_pretrained(offline_models.model_dir(name))


def runs(tokenizer, ids, mask):
    """The rendered tokens cut into runs of equal mask, each decoded: [(text, trained)]."""
    out, start = [], 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or mask[end] != mask[start]:
            out.append((tokenizer.decode(ids[start:end]), mask[start]))
            start = end
    return out


def check(tokenizer, ids, mask, segments):
    """Every token lies in the segment it should: the ids are the whole text's tokens and the
    runs of equal mask decode exactly to the (text, trained) segments."""
    assert ids == tokenizer("".join(t for t, _ in segments), add_special_tokens=False).input_ids
    assert runs(tokenizer, ids, mask) == segments


def chatml_segments(system_block):
    return [
        (f"{system_block}<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", 0),
        ("Hello there!<|im_end|>", 1),
        ("\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", 0),
        ("It is 4, of course.<|im_end|>", 1),
        ("\n", 0),
    ]


SMOL_DEFAULT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                "Hugging Face<|im_end|>\n")
QWEN_DEFAULT = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                "assistant.<|im_end|>\n")
GIVEN_SYSTEM = "<|im_start|>system\nBe brief.<|im_end|>\n"


@pytest.mark.parametrize("template,default_system", [(CHATML_SMOLLM2, SMOL_DEFAULT),
                                                     (CHATML_QWEN25, QWEN_DEFAULT)],
                         ids=["smollm2", "qwen2.5"])
@pytest.mark.parametrize("with_system", [False, True], ids=["default-system", "system"])
def test_chatml_mask_is_exact(smollm_tokenizer, template, default_system, with_system):
    tokenizer = with_template(smollm_tokenizer, template)
    messages = ([SYSTEM] if with_system else []) + TURNS
    ids, mask = render_messages(tokenizer, messages, resolve_chat_template(tokenizer))
    check(tokenizer, ids, mask, chatml_segments(GIVEN_SYSTEM if with_system else default_system))


def test_shipped_smollm2_template_matches(smollm_tokenizer):
    ids, mask = render_messages(smollm_tokenizer, TURNS, resolve_chat_template(smollm_tokenizer))
    check(smollm_tokenizer, ids, mask, chatml_segments(SMOL_DEFAULT))
    trained = smollm_tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert trained == "Hello there!<|im_end|>It is 4, of course.<|im_end|>"


def test_llama3_mask_is_exact_with_trimmed_content(smollm_tokenizer):
    tokenizer = with_template(smollm_tokenizer, LLAMA3, LLAMA3_SPECIALS)
    messages = [SYSTEM, *TURNS]
    messages[2] = {"role": "assistant", "content": "  Hello there!\n"}  # the template trims it
    ids, mask = render_messages(tokenizer, messages, resolve_chat_template(tokenizer))
    header = "<|start_header_id|>{}<|end_header_id|>\n\n"
    check(tokenizer, ids, mask, [
        ("<|begin_of_text|>" + header.format("system") + "Be brief.<|eot_id|>"
         + header.format("user") + "Hi<|eot_id|>" + header.format("assistant"), 0),
        ("Hello there!<|eot_id|>", 1),
        (header.format("user") + "What is 2+2?<|eot_id|>" + header.format("assistant"), 0),
        ("It is 4, of course.<|eot_id|>", 1),
    ])
    assert tokenizer.convert_ids_to_tokens(ids[-1]) == "<|eot_id|>" and mask[-1] == 1


def test_char_tokenizer_mask_and_truncation():
    tokenizer = char_tokenizer()
    template = resolve_chat_template(tokenizer)
    ids, mask = render_messages(tokenizer, TURNS, template)
    trained = "".join(tokenizer.decode([t]) for t, m in zip(ids, mask, strict=True) if m)
    assert trained == "Hello there!<|im_end|>It is 4, of course.<|im_end|>"
    short_ids, short_mask = render_messages(tokenizer, TURNS, template, max_length=50)
    assert (short_ids, short_mask) == (ids[:50], mask[:50])


def test_render_conversations_truncates_and_drops_untrainable():
    tokenizer = char_tokenizer()
    template = resolve_chat_template(tokenizer)
    long_prompt = Conversation("long", ({"role": "user", "content": "x" * 300},
                                        {"role": "assistant", "content": "ok"}))
    fits = Conversation("fits", tuple(TURNS))
    stats = RenderStats()
    samples = render_conversations(tokenizer, [long_prompt, fits], template, 200, stats)
    assert [s.conversation_id for s in samples] == ["fits"]
    assert stats.dropped == {"no assistant token within max_length": 1}
    assert stats.truncated == 1 and stats.rendered == 1
    assert stats.masked_tokens == sum(samples[0].loss_mask)


def test_missing_template_is_an_error_unless_given():
    tokenizer = char_tokenizer()
    tokenizer.chat_template = None
    with pytest.raises(DraftsmithError, match=r"no chat template.*chat_template"):
        resolve_chat_template(tokenizer)
    assert resolve_chat_template(tokenizer, CHATML_QWEN25) == CHATML_QWEN25


def test_template_from_file_and_missing_file(tmp_path):
    path = tmp_path / "chat.jinja"
    path.write_text(LLAMA3)
    assert resolve_chat_template(char_tokenizer(), str(path)) == LLAMA3
    with pytest.raises(DraftsmithError, match="neither a Jinja template nor an existing file"):
        resolve_chat_template(char_tokenizer(), str(tmp_path / "nope.jinja"))


def test_template_that_rewrites_history_is_refused():
    # drops every assistant turn but the last one, like templates that strip old reasoning
    template = ("{% for m in messages %}{% if m.role != 'assistant' or loop.last %}"
                "{{ m.role + ': ' + m.content + '\n' }}{% endif %}{% endfor %}"
                "{% if add_generation_prompt %}assistant: {% endif %}")
    with pytest.raises(DraftsmithError, match="not prefix-stable"):
        render_messages(char_tokenizer(), TURNS, template)
