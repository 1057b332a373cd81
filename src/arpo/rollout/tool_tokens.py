"""Token ids of what the environment appends to a rollout: a tool's text never becomes a special token.

A tool's output is data. Encoded like ordinary text, a program that prints `<|im_end|>` or
`<|im_start|>` would put the *real* end-of-turn and turn-start tokens into the transcript the policy
trains on — a turn structure the tool forged. So the tools' own text is encoded with special tokens
split (`split_special_tokens=True`: `<|im_end|>` becomes the characters `<`, `|`, `im`, ...), and
the result is checked to hold no special id. Only the markup the environment itself adds around it
(the json format's chat-template markers, e.g. `<|im_end|>\\n<|im_start|>user\\n<tool_response>`)
is encoded with its special tokens as real tokens.

An appended block is a list of pieces `(text, from_tool)`; `encode_pieces` encodes each on its own
and concatenates (the rollout never re-tokenizes, so piece boundaries are token boundaries).
"""

from __future__ import annotations

from arpo.errors import ArpoError

Pieces = list[tuple[str, bool]]  # (text, from_tool): True = a tool's text (plain), False = template markup


def special_ids(tokenizer) -> set[int]:
    """Ids of the tokenizer's special tokens (named ones and added tokens marked special)."""
    ids = set(getattr(tokenizer, "all_special_ids", ()) or ())
    for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(t, "special", False):
            ids.add(int(i))
    return ids


def encode_tool_text(tokenizer, text: str) -> list[int]:
    """`text` as plain tokens: special-token strings in it are split into ordinary tokens.
    Raises ArpoError when the tokenizer still produced a special id (it ignores
    `split_special_tokens`), rather than let a tool forge the transcript."""
    if not text:
        return []
    ids = list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
    bad = special_ids(tokenizer).intersection(ids)
    if bad:
        names = ", ".join(sorted(str(tokenizer.convert_ids_to_tokens(i)) for i in bad))
        raise ArpoError(f"the tokenizer {type(tokenizer).__name__} turned tool output into special tokens ({names}) "
                        "even with split_special_tokens=True; use a transformers tokenizer that supports it")
    return ids


def encode_pieces(tokenizer, pieces: Pieces) -> list[int]:
    """Token ids of an appended block: tool text plain (encode_tool_text), template markup as usual."""
    out: list[int] = []
    for text, from_tool in pieces:
        if text:
            out += encode_tool_text(tokenizer, text) if from_tool else tokenizer.encode(text, add_special_tokens=False)
    return out

