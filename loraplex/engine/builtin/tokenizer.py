"""Byte-level BPE tokenizers for the built-in models, trained locally with `tokenizers`.

Each family gets its real pre-tokenizer regex, special tokens (single ids, after the BPE
vocabulary as in the real models), a chat template, and bos/eos/pad settings, saved in HF
format so ``AutoTokenizer.from_pretrained(dir)`` and the cookbook renderers work offline.
Reserved special tokens fill the vocabulary up to the requested size, so every model id
decodes. Knows nothing about model weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from loraplex.engine.builtin.corpus import corpus

QWEN_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA_REGEX = QWEN_REGEX.replace(r"|\p{N}|", r"|\p{N}{1,3}|")  # digits in groups of 3

QWEN_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
#: Qwen3.5's template for text conversations (images and tools aside), as the cookbook's
#: ``qwen3_5`` renderer renders them: contents trimmed; an assistant turn after the last user
#: message carries its (possibly empty) ``<think>`` block; the generation prompt opens one
#: (``enable_thinking=False``: an empty, closed one).
QWEN3_5_CHAT_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- set content = message['content'] | trim %}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- set reasoning = (message.get('reasoning_content') or '') | trim %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] | trim %}"
    "{%- set content = content.split('</think>')[-1] | trim %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_user %}"
    "{{- '<|im_start|>assistant\n<think>\n' + reasoning + '\n</think>\n\n' + content"
    " + '<|im_end|>\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>assistant\n' + content + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\n<think>\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '\n</think>\n\n' }}{%- endif %}"
    "{%- endif %}"
)
#: gpt-oss's Harmony format for text conversations, as the cookbook's ``gpt_oss_*`` renderers
#: render them: with ``reasoning_effort`` (``low`` / ``medium`` / ``high``) the system preamble
#: naming it (and today's date), without it none (``gpt_oss_no_sysprompt``); a system message
#: becomes the developer's instructions; each turn ``<|start|>role<|message|>…<|end|>``, an
#: assistant turn on the ``final`` channel, the conversation's last one (a training target)
#: ending in ``<|return|>``; the generation prompt ``<|start|>assistant``.
HARMONY_CHAT_TEMPLATE = (
    "{%- if reasoning_effort is defined %}"
    "{{- '<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI."
    "\nKnowledge cutoff: 2024-06\nCurrent date: ' + strftime_now('%Y-%m-%d')"
    " + '\n\nReasoning: ' + reasoning_effort + '\n\n# Valid channels: analysis, commentary,"
    " final. Channel must be included for every message.<|end|>' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}"
    "{{- '<|start|>developer<|message|># Instructions\n\n' + message['content']"
    " + '\n\n<|end|>' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' + message['content'] }}"
    "{{- '<|return|>' if loop.last and not add_generation_prompt else '<|end|>' }}"
    "{%- else %}"
    "{{- '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}"
)
LLAMA_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class TokenizerFamily:
    """What differs between the Qwen and Llama 3 tokenizers.

    Attributes:
        regex: pre-tokenizer split pattern.
        special: special tokens (decoded away with ``skip_special_tokens``), in id order.
        added: added non-special tokens (kept when decoding), e.g. Qwen's ``<think>``.
        bos, eos, pad: tokenizer_config roles (None: unset).
        generation_eos: eos ids of generation_config.json, as token strings.
        chat_template: Jinja chat template.
    """

    regex: str
    special: tuple[str, ...]
    added: tuple[str, ...]
    bos: str | None
    eos: str
    pad: str | None
    generation_eos: tuple[str, ...]
    chat_template: str


QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
QWEN_VISION_SPECIAL = (*QWEN_SPECIAL, "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                       "<|video_pad|>")
QWEN_THINK = ("<think>", "</think>")


def qwen_family(special: tuple[str, ...], added: tuple[str, ...],
                chat_template: str) -> TokenizerFamily:
    """A Qwen tokenizer: Qwen's split pattern and chat-token roles, with these tokens."""
    return TokenizerFamily(
        regex=QWEN_REGEX, special=special, added=added,
        bos=None, eos="<|im_end|>", pad="<|endoftext|>",
        generation_eos=("<|im_end|>", "<|endoftext|>"),
        chat_template=chat_template,
    )


TOKENIZER_FAMILIES = {
    "qwen3": qwen_family(QWEN_SPECIAL, QWEN_THINK, QWEN_CHAT_TEMPLATE),
    # Qwen3-VL: Qwen3's tokens plus the vision markers (images stand as <|image_pad|> runs).
    "qwen3_vl": qwen_family(QWEN_VISION_SPECIAL, QWEN_THINK, QWEN_CHAT_TEMPLATE),
    # Qwen3.5: Qwen's chat tokens plus its vision and tool tokens (the template: see above).
    "qwen3_5": qwen_family(QWEN_VISION_SPECIAL, (*QWEN_THINK, "<tool_call>", "</tool_call>"),
                           QWEN3_5_CHAT_TEMPLATE),
    # gpt-oss: the Harmony format's tokens (the template: see above).
    "harmony": TokenizerFamily(
        regex=QWEN_REGEX,
        special=("<|startoftext|>", "<|endoftext|>", "<|start|>", "<|end|>", "<|message|>",
                 "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"),
        added=(),
        bos="<|startoftext|>", eos="<|return|>", pad="<|endoftext|>",
        generation_eos=("<|return|>", "<|endoftext|>", "<|call|>"),
        chat_template=HARMONY_CHAT_TEMPLATE,
    ),
    "llama": TokenizerFamily(
        regex=LLAMA_REGEX,
        special=("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                 "<|end_header_id|>", "<|eot_id|>"),
        added=(),
        bos="<|begin_of_text|>", eos="<|eot_id|>", pad="<|end_of_text|>",
        generation_eos=("<|end_of_text|>", "<|eot_id|>"),
        chat_template=LLAMA_CHAT_TEMPLATE,
    ),
}


def build_tokenizer(arch: str, vocab_size: int, seed: int, corpus_chars: int) -> object:
    """Train the BPE and wrap it as a transformers fast tokenizer with exactly ``vocab_size``
    ids (BPE merges, then the family's tokens, then reserved special tokens)."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    family = TOKENIZER_FAMILIES[arch]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(family.regex), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    num_family = len(family.special) + len(family.added)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - num_family, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(seed, corpus_chars), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in family.special])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in family.added])
    reserved = [f"<|reserved_special_token_{i}|>" for i in range(vocab_size - tok.get_vocab_size())]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in reserved])
    if family.bos is not None:
        bos_id = tok.token_to_id(family.bos)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{family.bos} $A", pair=f"{family.bos} $A $B:1",
            special_tokens=[(family.bos, bos_id)])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=family.bos, eos_token=family.eos,
        pad_token=family.pad, chat_template=family.chat_template,
        clean_up_tokenization_spaces=False, model_max_length=1 << 20,
    )


def save_tokenizer(tokenizer: object, directory: Path) -> None:
    """``save_pretrained``, with the class name every transformers version knows."""
    tokenizer.save_pretrained(str(directory))  # type: ignore[attr-defined]
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2) + "\n")


def token_id(tokenizer: object, token: str) -> int:
    ids = tokenizer.convert_tokens_to_ids([token])  # type: ignore[attr-defined]
    return int(ids[0])
