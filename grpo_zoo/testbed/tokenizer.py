"""The testbed's offline tokenizer: one token per character, Qwen's special tokens, a short chat template.

Built with the `tokenizers` library as a byte-level BPE with *no merges*: every byte is one
token, so any text round-trips exactly (spaces, newlines, braces, backslashes, even non-ASCII).
A WordLevel vocabulary looks simpler but transformers 5 reloads it as Qwen2Tokenizer, which
silently drops spaces and newlines; a byte-level BPE survives that reload unchanged.

The ids of the task alphabet come first, then the other bytes (so that the vocabulary is
complete), then the chat/vision special tokens and "<think>"/"</think>".
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

# Qwen2.5-VL's special tokens, in Qwen's order. <|video_pad|> must exist even without video:
# the processor and the model config both look its id up.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# Plain added tokens (not stripped by skip_special_tokens), as in Qwen's vocabulary.
THINK_TOKENS = ("<think>", "</think>")

# Every rendered character is a token the tiny model must read, so the template is minimal:
# no default system prompt, images as vision_start + image_pad + vision_end (the processor
# expands the one image_pad into as many as the image has tokens).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def default_alphabet() -> str:
    """The task alphabet: grpo_zoo.testbed.task.ALPHABET, else printable ASCII + newline."""
    try:
        from grpo_zoo.testbed.task import ALPHABET  # written by the task module

        return str(ALPHABET)
    except ImportError:
        return "".join(chr(i) for i in range(32, 127)) + "\n"


def build_tokenizer(alphabet: str | None = None) -> PreTrainedTokenizerFast:
    """Build the character-level tokenizer (byte-level BPE, no merges) with the chat template.

    Args:
        alphabet: characters whose bytes get the first ids (order kept, duplicates dropped);
            None = `default_alphabet()`. All 256 bytes are always in the vocabulary.
    Returns:
        A fast tokenizer with eos `<|im_end|>`, pad `<|endoftext|>` and `chat_template` set;
        `save_pretrained` + `AutoTokenizer.from_pretrained` give it back unchanged.
    """
    alphabet = default_alphabet() if alphabet is None else alphabet
    if not alphabet:
        raise ValueError("build_tokenizer: alphabet is empty; pass the characters the task uses")
    byte_symbol = bytes_to_unicode()  # byte -> printable stand-in char, as GPT-2 byte-level BPE
    vocab: dict[str, int] = {}
    for byte in alphabet.encode("utf-8"):
        vocab.setdefault(byte_symbol[byte], len(vocab))
    for byte in range(256):
        vocab.setdefault(byte_symbol[byte], len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False))
    # No regex split: with no merges the split would not change the tokens, only cost time.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in THINK_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=32768,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
