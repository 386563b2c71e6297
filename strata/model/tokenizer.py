"""The tokenizer of a GGUF model (byte-level BPE, `tokenizer.ggml.model == "gpt2"`).

Built from GGUF metadata on top of HF `tokenizers`, configured so that ids match llama.cpp's
tokenizer for the same file: the pre-tokenizer split regex of the GGUF's `tokenizer.ggml.pre`
(in the explicit-case form llama.cpp uses), byte-level BPE with merge ranks from the GGUF, and
special tokens matched in raw text first (CONTROL tokens only when `parse_special`; USER_DEFINED
ones always, as llama.cpp does). Decoding is our own byte table, so `token_bytes` and streaming
see exactly the bytes llama.cpp's `token_to_piece` would.
"""

from __future__ import annotations

import codecs
import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import tokenizers
from gguf import TokenType
from gguf.constants import Keys
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

from strata.model.errors import ModelError

K = Keys.Tokenizer

_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35 = (  # Qwen2 with combining marks (\p{M}) kept inside letter runs
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+"
    r"|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

# tokenizer.ggml.pre -> (split regex, ignore_merges); the subset of llama.cpp's table we support.
PRE_TOKENIZERS: dict[str, tuple[str, bool]] = {
    "qwen2": (_QWEN2, False),
    "deepseek-r1-qwen": (_QWEN2, False),
    "qwen35": (_QWEN35, False),
    "llama3": (_LLAMA3, True),
    "llama-v3": (_LLAMA3, True),
    "llama-bpe": (_LLAMA3, True),
    "gpt-2": (_GPT2, False),
}

# Pre-tokenizers for which llama.cpp adds BOS when the GGUF has no add_bos_token key.
_ADD_BOS_DEFAULT = frozenset({"llama3", "llama-v3", "llama-bpe"})

# llama.cpp's load-time fix-ups of special tokens (llama-vocab.cpp), mirrored so that ids, hidden
# tokens and stop tokens agree with it. When the GGUF leaves the id key unset, a token with one
# of these texts is promoted to CONTROL (FIM pad/rep/sep ones also end generation).
_AUTO_CONTROL: dict[str, list[str]] = {
    K.EOT_ID: "<|eot_id|> <|im_end|> <|end|> <end_of_turn> <|endoftext|> <|end_of_text|> <EOT> "
    "_<EOT> [EOT] <｜end▁of▁sentence｜> <end_of_utterance>".split(),
    K.EOM_ID: ["<|eom_id|>"],
    K.FIM_PRE_ID: "<|fim_prefix|> <fim-prefix> <fim_prefix> <｜fim▁begin｜> <PRE> ▁<PRE> "
    "<|code_prefix|> <|prefix|>".split(),
    K.FIM_SUF_ID: "<|fim_suffix|> <fim-suffix> <fim_suffix> <｜fim▁hole｜> <SUF> ▁<SUF> "
    "<|code_suffix|> <|suffix|>".split(),
    K.FIM_MID_ID: "<|fim_middle|> <fim-middle> <fim_middle> <｜fim▁end｜> <MID> ▁<MID> "
    "<|code_middle|> <|middle|>".split(),
    K.FIM_PAD_ID: "<|fim_pad|> <fim-pad> <fim_pad> <PAD> [PAD]".split(),
    K.FIM_REP_ID: "<|fim_repo|> <|repo_name|> <fim-repo> <REPO> <reponame>".split(),
    K.FIM_SEP_ID: ["<|file_sep|>"],
}
_EOG_KEYS = (K.EOS_ID, K.EOT_ID, K.EOM_ID, K.FIM_PAD_ID, K.FIM_REP_ID, K.FIM_SEP_ID)
# Texts that always end generation (and become CONTROL), whatever the GGUF says.
EOG_TEXTS = frozenset(
    "<|eot_id|> <|im_end|> <|end|> <|return|> <|call|> <|flush|> <|calls|> <end_of_turn> "
    "<|endoftext|> </s> <|eom_id|> <EOT> _<EOT> [EOT] [EOS] <|end_of_text|> <end_of_utterance> "
    "<eos> <turn|> <|tool_response> <｜end▁of▁sentence｜> [e~[".split()
)
CHUNK_CHARS = 1 << 18  # long texts are tokenized in pieces of about this many characters
_ALWAYS_USER = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss

_NORMAL, _CONTROL, _USER, _UNKNOWN = (
    int(TokenType.NORMAL),
    int(TokenType.CONTROL),
    int(TokenType.USER_DEFINED),
    int(TokenType.UNKNOWN),
)
_UNUSED, _BYTE = int(TokenType.UNUSED), int(TokenType.BYTE)


def _byte_level_table() -> dict[str, int]:
    """GPT-2's byte <-> printable-char map, inverted: char -> byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: b for b in keep}
    n = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + n
            n += 1
    return {chr(c): b for b, c in chars.items()}


_CHAR_TO_BYTE = _byte_level_table()
_TO_LATIN1 = str.maketrans({c: chr(b) for c, b in _CHAR_TO_BYTE.items()})
_NOT_BYTE_CHAR = re.compile("[^" + re.escape("".join(sorted(_CHAR_TO_BYTE))) + "]")


def _decode_byte_level(text: str) -> bytes:
    if _NOT_BYTE_CHAR.search(text) is None:
        return text.translate(_TO_LATIN1).encode("latin-1")
    # A char outside the byte-level alphabet (malformed vocab): keep its UTF-8 bytes.
    return b"".join(bytes((_CHAR_TO_BYTE[c],)) if c in _CHAR_TO_BYTE else c.encode() for c in text)


def _opt_int(meta: Mapping[str, Any], key: str) -> int | None:
    v = meta.get(key)
    return None if v is None else int(v)


class Tokenizer:
    """Byte-level BPE tokenizer with llama.cpp-identical ids. Thread-safe for encode/decode."""

    def __init__(
        self,
        tokens: Sequence[str],
        token_types: Sequence[int] | None,
        merges: Sequence[str],
        *,
        pre: str = "qwen2",
        bos_id: int | None = None,
        eos_id: int | None = None,
        pad_id: int | None = None,
        add_bos: bool = False,
        add_eos: bool = False,
        special_ids: Mapping[str, int] | None = None,
    ) -> None:
        """`special_ids`: other id keys of the GGUF (`Keys.Tokenizer.EOT_ID`, FIM ids, ...)."""
        if pre not in PRE_TOKENIZERS:
            known = ", ".join(sorted(PRE_TOKENIZERS))
            raise ModelError(f"pre-tokenizer {pre!r} is not supported (supported: {known})")
        n = len(tokens)
        self._tokens = list(tokens)
        self._types = [_NORMAL] * n if token_types is None else [int(t) for t in token_types]
        if len(self._types) != n:
            raise ModelError(f"tokenizer has {n} tokens but {len(self._types)} token types")
        keyed = {k: int(v) for k, v in (special_ids or {}).items() if v is not None}
        keyed.update({K.EOS_ID: eos_id} if eos_id is not None else {})
        for key, tid in ((K.BOS_ID, bos_id), *keyed.items()):
            if tid is not None and not 0 <= tid < n:
                raise ModelError(f"{key} = {tid} is outside the vocabulary of {n} tokens")
        self._ids = {
            t: i for i, t in enumerate(self._tokens)
        }  # duplicates: last wins, as llama.cpp
        self.pre = pre
        self._bos_id, self._eos_id, self.pad_id = bos_id, eos_id, pad_id
        self.add_bos, self.add_eos = add_bos, add_eos
        self._eos_ids = self._llama_cpp_fixups(keyed)

        pattern, ignore_merges = PRE_TOKENIZERS[pre]
        self._hf = self._build(merges, pattern, ignore_merges)
        self._hf_plain: tokenizers.Tokenizer | None = None  # lazily: CONTROL tokens as text
        self._lock = threading.Lock()
        self._bytes: list[bytes | None] = [None] * n
        specials = (t for i, t in enumerate(self._tokens) if self.is_special(i))
        self._chunkable = not any(" " in t for t in specials)  # see _parts

    def _llama_cpp_fixups(self, keyed: dict[str, int]) -> frozenset[int]:
        """Apply llama.cpp's token-type fix-ups to `self._types`; returns the end-of-gen ids."""
        ids, types = self._ids, self._types
        eog = {keyed[k] for k in _EOG_KEYS if k in keyed}
        promoted = {ids[t] for t in EOG_TEXTS if t in ids}
        eog |= promoted
        for key, texts in _AUTO_CONTROL.items():
            if key not in keyed:
                found = {ids[t] for t in texts if t in ids}
                promoted |= found
                eog |= found if key in _EOG_KEYS else set()
        for i in promoted:
            if types[i] != _UNKNOWN:
                types[i] = _CONTROL
        for t in _ALWAYS_USER:
            if t in ids:
                types[ids[t]] = _USER
        texts = {self._tokens[i] for i in eog}
        calls = texts & {"<|call|>", "<|calls|>"}
        if "<|end|>" in texts and calls and texts & {"<|return|>", "<|flush|>"}:
            # o200k_harmony / solar-open: there <|end|> separates messages, it does not stop
            eog.discard(ids["<|end|>"])
            types[ids["<|end|>"]] = _USER
        if "</s>" in texts and texts & {"<|tool_response>", "<|plamo:eos|>"}:  # a normal </s>
            eog.discard(ids["</s>"])
            types[ids["</s>"]] = _NORMAL
        return frozenset(eog)

    def _build(self, merges: Sequence[str], pattern: str, ignore_merges: bool):
        vocab = self._ids
        pairs = []
        for m in merges:
            # llama.cpp splits at the first space after position 0 (a merge may start with ' ').
            p = m.find(" ", 1)
            if p < 0:
                continue
            a, b = m[:p], m[p + 1 :]
            if a in vocab and b in vocab and a + b in vocab:
                pairs.append((a, b))
        hf = tokenizers.Tokenizer(models.BPE(vocab, pairs, ignore_merges=ignore_merges))
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        hf.decoder = decoders.ByteLevel()
        control = [i for i, t in enumerate(self._types) if t in (_CONTROL, _UNKNOWN)]
        user = [i for i, t in enumerate(self._types) if t == _USER]
        hf.add_special_tokens(
            [AddedToken(self._tokens[i], special=True, normalized=False) for i in control]
        )
        hf.add_tokens([AddedToken(self._tokens[i], special=False, normalized=False) for i in user])
        return hf

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> Tokenizer:
        """The tokenizer described by a GGUF's metadata (`GGUFModel.metadata`)."""
        model = meta.get(K.MODEL)
        if model != "gpt2":
            raise ModelError(
                f"tokenizer model {model!r} is not supported: Strata reads byte-level BPE "
                f"('gpt2') vocabularies only"
            )
        tokens = meta.get(K.LIST)
        merges = meta.get(K.MERGES)
        if not tokens or merges is None:
            raise ModelError("GGUF has no tokenizer token list or merges; cannot tokenize")
        pre = meta.get(K.PRE)
        if pre is None:
            raise ModelError("GGUF names no pre-tokenizer (tokenizer.ggml.pre); cannot tokenize")
        return cls(
            tokens,
            meta.get(K.TOKEN_TYPE),
            merges,
            pre=str(pre),
            bos_id=_opt_int(meta, K.BOS_ID),
            eos_id=_opt_int(meta, K.EOS_ID),
            pad_id=_opt_int(meta, K.PAD_ID),
            add_bos=bool(meta.get(K.ADD_BOS, str(pre) in _ADD_BOS_DEFAULT)),
            add_eos=bool(meta.get(K.ADD_EOS, False)),
            special_ids={k: _opt_int(meta, k) for k in _AUTO_CONTROL if k in meta},
        )

    # ---- properties -------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    @property
    def bos_id(self) -> int | None:
        return self._bos_id

    @property
    def eos_id(self) -> int | None:
        return self._eos_id

    @property
    def eos_ids(self) -> frozenset[int]:
        """Every id that ends generation (eos, eot, `<|im_end|>`, `<|endoftext|>`, ...)."""
        return self._eos_ids

    def token_text(self, token_id: int) -> str:
        """The vocabulary entry as stored in the GGUF (byte-level chars for normal tokens)."""
        return self._tokens[token_id]

    def token_id(self, text: str) -> int | None:
        """The id of the vocabulary entry `text` (GGUF form), or None."""
        return self._ids.get(text)

    def is_special(self, token_id: int) -> bool:
        """CONTROL, USER_DEFINED or UNKNOWN tokens: matched whole in text, never merged into."""
        return self._types[token_id] in (_CONTROL, _USER, _UNKNOWN)

    def is_control(self, token_id: int) -> bool:
        """Tokens hidden by `decode(skip_special=True)` (llama.cpp's CONTROL/UNKNOWN)."""
        return self._types[token_id] in (_CONTROL, _UNKNOWN)

    # ---- encode -----------------------------------------------------------------------------

    def _plain(self) -> tokenizers.Tokenizer:
        with self._lock:
            if self._hf_plain is None:
                plain = tokenizers.Tokenizer.from_str(self._hf.to_str())
                plain.encode_special_tokens = True
                self._hf_plain = plain
            return self._hf_plain

    def encode(
        self,
        text: str,
        add_bos: bool | None = None,
        parse_special: bool = True,
        stop_after: int | None = None,
    ) -> list[int]:
        """Token ids of `text`.

        `add_bos`: True prepends BOS, False adds nothing, None follows the GGUF's add_bos/add_eos
        flags (llama.cpp's `add_special`). `parse_special=False` tokenizes CONTROL token texts
        such as `<|im_end|>` as plain text; USER_DEFINED ones (`<think>`) always match whole.
        `stop_after`: once more than this many ids are certain, stop and return those (a prefix
        of the ids, longer than `stop_after`): a prompt too long for the context costs only the
        tokenizing of its first part.
        """
        hf = self._hf if parse_special else self._plain()
        ids: list[int] = []
        for part in self._parts(text):
            # encode_batch releases the GIL while it works; encode holds it for the whole text,
            # which would stall every other thread (the server's event loop) on a long prompt
            ids += hf.encode_batch([part], add_special_tokens=False)[0].ids
            if stop_after is not None and len(ids) > stop_after:
                return ids
        if add_bos is None:
            if self.add_bos and self._bos_id is not None:
                ids.insert(0, self._bos_id)
            if self.add_eos and self._eos_id is not None:
                ids.append(self._eos_id)
        elif add_bos and self._bos_id is not None:
            ids.insert(0, self._bos_id)
        return ids

    def _parts(self, text: str) -> Iterator[str]:
        """`text` in pieces of about CHUNK_CHARS that tokenize to the ids of the whole text.

        Each piece but the last ends just before a space that sits between two letters: every
        supported split regex ends a pre-token there (letters never run into a space, and a
        space before a letter starts the next word), and no special token spans it when no
        special token holds a space. Text without such a place stays whole.
        """
        if len(text) <= 2 * CHUNK_CHARS or not self._chunkable:
            yield text
            return
        start = 0
        while len(text) - start > 2 * CHUNK_CHARS:
            cut = text.find(" ", start + CHUNK_CHARS)
            while cut > 0 and not (text[cut - 1].isalpha() and text[cut + 1 : cut + 2].isalpha()):
                cut = text.find(" ", cut + 1)
            if cut < 0:
                break
            yield text[start:cut]
            start = cut
        yield text[start:]

    def encode_batch(self, texts: Sequence[str], parse_special: bool = True) -> list[list[int]]:
        """`encode(t, add_bos=False)` for each text, in parallel."""
        hf = self._hf if parse_special else self._plain()
        return [e.ids for e in hf.encode_batch(list(texts), add_special_tokens=False)]

    # ---- decode -----------------------------------------------------------------------------

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token `token_id` stands for (llama.cpp's `token_to_piece` with special)."""
        b = self._bytes[token_id]
        if b is None:
            text, ttype = self._tokens[token_id], self._types[token_id]
            if ttype in (_CONTROL, _USER, _UNKNOWN):
                b = text.encode()
            elif ttype == _UNUSED:
                b = b""
            else:  # NORMAL, BYTE and undefined types
                b = _decode_byte_level(text)
            self._bytes[token_id] = b
        return b

    def decode_bytes(self, ids: Iterable[int], skip_special: bool = False) -> bytes:
        if skip_special:
            return b"".join(self.token_bytes(i) for i in ids if not self.is_control(i))
        return b"".join(self.token_bytes(i) for i in ids)

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """The text of `ids`; invalid UTF-8 becomes U+FFFD. `skip_special` drops CONTROL tokens."""
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    def stream(self, skip_special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, skip_special=skip_special)

    def __repr__(self) -> str:
        return f"Tokenizer(pre={self.pre!r}, vocab_size={self.vocab_size})"


class StreamDecoder:
    """Turns ids, one at a time, into text pieces that never split a UTF-8 character.

    Byte-level BPE may cut a multi-byte character across tokens; the partial bytes are held
    back until the character is complete. `push` returns "" while waiting; `flush` returns what
    is left (U+FFFD for a truncated character) at the end of generation.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False) -> None:
        self._tok = tokenizer
        self._skip = skip_special
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        if self._skip and self._tok.is_control(token_id):
            return ""
        return self._dec.decode(self._tok.token_bytes(token_id))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)

    def feed(self, ids: Iterable[int]) -> Iterator[str]:
        """Yields the non-empty pieces for `ids`, then whatever `flush` leaves."""
        for i in ids:
            piece = self.push(i)
            if piece:
                yield piece
        tail = self.flush()
        if tail:
            yield tail
