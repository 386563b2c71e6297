"""A small, deterministic byte-level BPE vocabulary for synthetic qwen3moe models.

Qwen2-style: 256 byte-level tokens, merges learned with `tokenizers` on a corpus generated here
from a fixed seed (English prose, Python code, whitespace runs, accented/CJK/emoji text), then
the special tokens of Qwen3 at the very end. Same `n_vocab` -> same vocabulary on any machine
with the same `tokenizers` version.
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass, field

import gguf
from gguf import TokenType
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

# The Qwen2 split pattern in the explicit-case form llama.cpp uses (LLAMA_VOCAB_PRE_TYPE_QWEN2).
QWEN2_PATTERN = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SPECIAL_TOKENS: tuple[tuple[str, TokenType], ...] = (
    ("<|endoftext|>", TokenType.CONTROL),
    ("<|im_start|>", TokenType.CONTROL),
    ("<|im_end|>", TokenType.CONTROL),
    ("<think>", TokenType.USER_DEFINED),
    ("</think>", TokenType.USER_DEFINED),
)

# Qwen3-like ChatML: system/user/assistant/tool turns; earlier assistant turns lose their think
# block; `enable_thinking=False` pre-fills an empty think block, as Qwen3's own template does.
QWEN3_CHAT_TEMPLATE = """\
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}\
{% endfor %}
{%- for m in messages %}
{%- set content = m.content if m.content is string else '' %}
{%- if m.role == 'assistant' and loop.index0 < ns.last_user and '</think>' in content %}
{%- set content = content.split('</think>')[-1].lstrip('\\n') %}
{%- endif %}
{%- if m.role == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>\\n' + content + '\\n</tool_response><|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\\n\\n</think>\\n\\n' }}
{%- endif %}
{%- endif %}
"""

MIN_VOCAB = 512
MAX_LEARNED = 8192  # beyond this, filler tokens: training a 151k vocabulary would take minutes
_SEED = 20240917

_PROSE = """\
The quick brown fox jumps over the lazy dog. A mixture of experts routes every token to a few
small networks; the rest stay idle. When the model is larger than the graphics card, the hottest
experts live in video memory and the others are computed on the processor, straight from their
quantized bytes. It's a trade: bandwidth against latency, and we'll measure both. They're not
free, and you'd better count the launches. I'm sure the cache hit rate will tell us where the
time goes. Numbers like 3.14159, 2048, 1e-5 and 0x7f appear in logs; so do dates (2024-09-17)
and versions (v0.19.2). "Quoted text," she said, 'and single quotes' too -- plus dashes - and
ellipses... Questions? Answers! Lists: apples, oranges; pears & plums. Emails: dev@example.com.
URLs: https://example.org/path?query=1&x=2#frag. Percent: 42%. Money: $19.99, EUR 5,00.
"""

_CODE = '''\
import numpy as np


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax."""
    m = x.max(axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=axis, keepdims=True)


class ExpertCache:
    def __init__(self, n_slots: int) -> None:
        self.slots: dict[int, int] = {}
        self.n_slots = n_slots

    def lookup(self, expert_id):
        if expert_id in self.slots:
            return self.slots[expert_id]
        return None

for i in range(10):
\tprint(f"step {i}: loss={i * 0.5:.3f}")
if __name__ == "__main__":
    main()
'''

_UNICODE = """\
Café, naïve, résumé, Ångström, Größe, façade, jalapeño, Dvořák, Łódź, São Paulo.
Ελληνικά γράμματα, русский текст, עברית, العربية, हिन्दी, ไทย.
中文分词测试：你好，世界！机器学习模型。日本語のテキスト、カタカナ。한국어 문장입니다.
Emoji: 😀 🚀 👍🏽 🇫🇷 👨‍👩‍👧 ❤️ ✨ — “smart quotes” ‘apostrophes’ … • ° ± × ÷ ≤ ≥ ≠ ∞ → ←
"""

_WORDS = (
    "the of and to in is that for it as with was on be by at this are from or have an which "
    "not but all were when we there can more if will one about up out has time into only some "
    "model token expert layer cache router weight tensor matrix vector kernel thread memory "
    "device host bandwidth latency decode prefill sample prompt server request stream batch "
    "quantize block scale offset shard file read write load store compute merge split encode "
    "value number string list dict return import class def self none true false print range"
).split()
_SYLLABLES = [c + v for c in "b c d f g h k l m n p r s t v w z ch sh th".split() for v in "aeiou"]
_CODE_NAMES = "x y i j k n idx buf out row col acc tmp val key data args kwargs cfg".split()
_OPS = " = ; + ; - ; * ; / ; // ; % ; ** ; == ; != ; <= ; >= ; += ; -= ; -> ; : ".split(";")
_SNIPPETS = (
    "    ",
    "        ",
    "\t\t",
    "\n\n",
    "\r\n",
    "  \n",
    "...",
    "!!!",
    "???",
    "-->",
    "===",
    "###",
    "```",
    "é",
    "ß",
    "ü",
    "中",
    "文",
    "😀",
    "€",
)


@dataclass
class SynthVocab:
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    bos_id: int
    eos_id: int
    pad_id: int
    special: dict[str, int] = field(default_factory=dict)

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)


def _corpus(n_lines: int) -> list[str]:
    """Fixed text plus `n_lines` generated lines from a seeded generator (same on every machine)."""
    rng = random.Random(_SEED)
    lines = [*_PROSE.splitlines(True), *_CODE.splitlines(True), *_UNICODE.splitlines(True)] * 4
    for i in range(n_lines):
        kind = i % 4
        if kind == 0:  # prose from common words
            words = [rng.choice(_WORDS) for _ in range(rng.randint(5, 14))]
            words[0] = words[0].capitalize()
            lines.append(" ".join(words) + rng.choice((". ", ", ", "? ", "!\n", ".\n")))
        elif kind == 1:  # invented words: gives the trainer fresh pairs for large vocabularies
            for _ in range(3):
                word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))
                lines.append(f" {word} {word.capitalize()} {word}s")
            lines.append(f" {rng.randint(0, 9999)}\n")
        elif kind == 2:  # code
            a, b = rng.choice(_CODE_NAMES), rng.choice(_CODE_NAMES)
            indent = " " * (4 * rng.randint(0, 3))
            lines.append(f"{indent}{a}{rng.choice(_OPS)}{b}[{rng.randint(0, 64)}]\n")
        else:  # whitespace runs, punctuation and non-ASCII snippets
            lines.append("".join(rng.choice(_SNIPPETS) for _ in range(rng.randint(1, 6))))
    return lines


def _trainer_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def _fillers(n: int, taken: set[str]) -> list[str]:
    """`n` distinct byte-level words (" " is "Ġ") not in `taken`, in a fixed order."""
    out: list[str] = []
    k = len(_SYLLABLES)
    i = 0
    while len(out) < n:
        j, word = i, ""
        while True:  # i in base k, one syllable per digit
            word += _SYLLABLES[j % k]
            j //= k
            if j == 0:
                break
        i += 1
        for w in ("Ġ" + word, "Ġ" + word.capitalize()):
            if w not in taken and len(out) < n:
                taken.add(w)
                out.append(w)
    return out


@functools.lru_cache(maxsize=8)
def synth_vocab(n_vocab: int) -> SynthVocab:
    """The synthetic vocabulary of exactly `n_vocab` tokens (cached; treat the result as read-only).

    Ids 0..255 are the byte-level alphabet, then up to MAX_LEARNED tokens from learned merges,
    then (large vocabularies only) NORMAL filler words no merge produces, so that sampling any
    id still prints text, then the five special tokens as the last ids.
    """
    if n_vocab < MIN_VOCAB:
        raise ValueError(f"n_vocab={n_vocab} is too small for a synthetic vocab (min {MIN_VOCAB})")
    n_learned = n_vocab - len(SPECIAL_TOKENS)
    tok = _trainer_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=min(n_learned, MAX_LEARNED),
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(_corpus(max(2000, 2 * min(n_learned, MAX_LEARNED))), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    if [vocab[t] for t in tokens] != list(range(len(tokens))):
        raise RuntimeError("BPE trainer produced non-contiguous ids")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    types = [int(TokenType.NORMAL)] * len(tokens)
    if len(tokens) > n_learned:
        raise RuntimeError(f"BPE trainer produced {len(tokens)} tokens, asked for {n_learned}")
    tokens += _fillers(n_learned - len(tokens), set(tokens))
    types += [int(TokenType.NORMAL)] * (n_learned - len(types))
    special: dict[str, int] = {}
    for text, ttype in SPECIAL_TOKENS:
        special[text] = len(tokens)
        tokens.append(text)
        types.append(int(ttype))
    eot = special["<|endoftext|>"]
    return SynthVocab(tokens, types, merges, bos_id=eot, eos_id=eot, pad_id=eot, special=special)


def add_tokenizer_metadata(
    writer: gguf.GGUFWriter,
    vocab: SynthVocab,
    chat_template: str | None = QWEN3_CHAT_TEMPLATE,
    *,
    pre: str = "qwen2",
) -> None:
    """Write the tokenizer keys a Qwen3 GGUF carries (model gpt2, pre qwen2) for `vocab`.

    `pre` names another llama.cpp pre-tokenizer (tests of the tokenizer use it).
    """
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(vocab.bos_id)
    writer.add_eos_token_id(vocab.eos_id)
    writer.add_pad_token_id(vocab.pad_id)
    writer.add_add_bos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
