"""The character-level tokenizer the tiny models use, its special ids, and ``encode_strict``.

Built from the ``tokenizers`` library in memory: nothing is downloaded.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<bos>", "<eos>", "<unk>"
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
CHARSET = "".join(chr(c) for c in range(32, 127)) + "\n"
"""Characters the char tokenizer knows: printable ASCII 32..126 (space included), then newline."""
UNK_ID = 3 + len(CHARSET)
"""``<unk>``: every other character (tab, accented letters, €, emoji ...), one per code point."""


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer: ``<pad>``=0, ``<bos>``=1, ``<eos>``=2, then one token per
    printable ASCII character 32..126 in code-point order, newline (97 + 1), and ``<unk>``
    last (vocab size 100).

    Encoding with ``add_special_tokens=True`` (the default) prepends ``<bos>``; padding is on the
    left. Any other character (a tab, an accented letter, €, an emoji) encodes as one ``<unk>``
    per code point, so user prompts never crash the tokenizer; ``<unk>`` is a special token, so
    decoding with ``skip_special_tokens`` drops it. The trainer counts such prompts
    (``data/prompts_with_unknown_chars``) and ``encode_strict`` still rejects them.
    """
    vocab = {PAD_TOKEN: PAD_ID, BOS_TOKEN: BOS_ID, EOS_TOKEN: EOS_ID}
    for ch in CHARSET:
        vocab[ch] = len(vocab)
    vocab[UNK_TOKEN] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # Every code point is its own pre-token, spaces and newlines included ("isolated" keeps
    # the matches; "." would not match a newline).
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=Regex(r"[\s\S]"), behavior="isolated")
    # Fuse concatenates the tokens with nothing in between, so spaces round-trip exactly.
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, BOS_ID)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        # No "cleanup" that would drop the space in e.g. "a ." on decode.
        clean_up_tokenization_spaces=False,
    )


def encode_strict(
    tokenizer: PreTrainedTokenizerBase, text: str, *, add_special_tokens: bool = True
) -> list[int]:
    """Encode ``text`` and fail loudly if any part of it is unknown to the tokenizer.

    Raises ``ValueError`` for characters outside the char tokenizer's charset, and for any
    tokenizer that has an unk token, if an unk id shows up in the encoding.
    """
    vocab = tokenizer.get_vocab()
    if all(ch in vocab for ch in CHARSET):
        # The char-level vocab: check characters up front, for a message naming them.
        bad = sorted({ch for ch in text if ch not in vocab})
        if bad:
            raise ValueError(f"characters not in the tokenizer vocabulary: {bad!r} in {text!r}")
    try:
        ids = tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
    except Exception as exc:  # tokenizers raises a bare Exception for missing unk
        raise ValueError(f"cannot encode {text!r}: {exc}") from exc
    if tokenizer.unk_token_id is not None and tokenizer.unk_token_id in ids:
        raise ValueError(f"text encodes to the unk token: {text!r}")
    return list(ids)
