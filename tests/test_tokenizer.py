"""Tokenizer, chat template and synthetic vocabulary: behaviour, and ids identical to llama.cpp."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import random
import threading
import time
from pathlib import Path

import gguf
import pytest
from gguf.constants import Keys

from strata.model import tokenizer as tokenizer_module
from strata.model.chat_template import CHATML_TEMPLATE, render_chat
from strata.model.errors import ModelError
from strata.model.gguf_file import GGUFModel
from strata.model.tokenizer import Tokenizer
from strata.model.vocab_synth import (
    QWEN3_CHAT_TEMPLATE,
    SPECIAL_TOKENS,
    add_tokenizer_metadata,
    synth_vocab,
)

N_VOCAB = 2048

# Varied text: prose, contractions, digits, code, whitespace, scripts, emoji, odd code points.
TEXTS = [
    "Hello world",
    " Hello World!",
    "I'm sure they'RE fine, we'll see; DON'T panic. It's 'quoted'.",
    "Numbers: 1234567890, 3.14159, -42, 1e-5, 0x7fff, 2024-09-17",
    "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n",
    "if (a && b) { c[i] += d->e; } // C++ <<=>>= !== ...",
    "   leading and trailing spaces   ",
    "tabs\t\tand\nnewlines\r\nand\rcarriage\n\n\n \n  \n",
    "                                                          ",
    "Café naïve résumé Ångström Größe façade Dvořák Łódź",
    "e\u0301 a\u0300 combining marks: \u0915\u093f\u0924\u093e\u092c"
    " \u0928\u092e\u0938\u094d\u0924\u0947",
    "中文分词测试：你好，世界！机器学习模型。日本語のテキスト、カタカナ。한국어",
    "Emoji 😀🚀 👍🏽 🇫🇷 👨‍👩‍👧 ❤️ ✨ 🦙.cpp",
    "Ελληνικά русский עברית العربية ไทย",
    "nbsp\u00a0ideographic\u3000space\u2028line\u2029para\u0085nel\u200bzwsp\ufeffbom",
    "controls \x00\x01\x07\x1b[0m\x1c\x1f\x7f end",
    "unassigned \u0378\u0379 private \ue000\U000f0000 astral \U0001d400\U0001f9ff",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
    "<think>\nLet me reason.\n</think>\n\nThe answer is 4.",
    "<|im_end|><|im_end|><|endoftext|>x<|im_start",
    "almost special: <|im_end <im_end|> <|IM_END|> < think>",
    "https://example.org/path?query=1&x=2#frag dev@example.com $19.99 42%",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "'s's 'S 'll'LL'Ll 'x ''' '",
    "a",
    " ",
    "\n",
    "",
]


# Tokens llama.cpp re-types at load by their text (real Qwen vocabularies have all of these).
EXTRA_TOKENS = [
    ("</s>", gguf.TokenType.NORMAL),  # becomes CONTROL and end-of-generation
    ("<|fim_prefix|>", gguf.TokenType.USER_DEFINED),  # becomes CONTROL
    ("<|fim_pad|>", gguf.TokenType.USER_DEFINED),  # becomes CONTROL and end-of-generation
    ("<|file_sep|>", gguf.TokenType.NORMAL),  # becomes CONTROL and end-of-generation
    ("<tool_call>", gguf.TokenType.USER_DEFINED),  # stays USER_DEFINED
    ("[PAD7]", gguf.TokenType.UNUSED),
]
EXTRA_TEXTS = [
    "a</s>b <|fim_prefix|>def f():<|fim_pad|><|file_sep|>x.py",
    '<tool_call>\n{"name": "f"}\n</tool_call>[PAD7]',
]


def _write_vocab_gguf(
    path: Path, pre: str = "qwen2", n_vocab: int = N_VOCAB, extra: bool = False
) -> Path:
    """A vocab-only qwen3moe GGUF: tokenizer keys plus the hparams llama.cpp reads at load.

    `extra` appends EXTRA_TOKENS (after the synthetic vocabulary's own specials).
    """
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_context_length(4096)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_expert_feed_forward_length(32)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_key_length(16)
    w.add_value_length(16)
    w.add_expert_count(4)
    w.add_expert_used_count(2)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    v = synth_vocab(n_vocab)
    if extra:
        v = dataclasses.replace(
            v,
            tokens=v.tokens + [t for t, _ in EXTRA_TOKENS],
            token_types=v.token_types + [int(k) for _, k in EXTRA_TOKENS],
        )
    add_tokenizer_metadata(w, v, pre=pre)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory) -> Path:
    return _write_vocab_gguf(tmp_path_factory.mktemp("vocab") / "vocab.gguf")


@pytest.fixture(scope="module")
def meta(gguf_path) -> dict:
    return dict(GGUFModel(gguf_path).metadata)


@pytest.fixture(scope="module")
def tok(meta) -> Tokenizer:
    return Tokenizer.from_metadata(meta)


# ---- synthetic vocabulary ----------------------------------------------------------------------


def test_synth_vocab_has_exactly_n_tokens_with_specials_last():
    v = synth_vocab(N_VOCAB)
    assert len(v.tokens) == len(v.token_types) == N_VOCAB
    names = [t for t, _ in SPECIAL_TOKENS]
    assert v.tokens[-len(names) :] == names
    assert v.special == {t: N_VOCAB - len(names) + i for i, t in enumerate(names)}
    assert v.bos_id == v.eos_id == v.pad_id == v.special["<|endoftext|>"]
    types = dict(zip(v.tokens, v.token_types, strict=True))
    assert types["<|im_end|>"] == gguf.TokenType.CONTROL
    assert types["<think>"] == gguf.TokenType.USER_DEFINED
    assert all(t == gguf.TokenType.NORMAL for t in v.token_types[:256])
    assert len(v.merges) > 1000 and all(" " in m for m in v.merges)


def test_synth_vocab_is_deterministic():
    a = synth_vocab(512)
    b = synth_vocab.__wrapped__(512)
    assert (a.tokens, a.merges, a.token_types) == (b.tokens, b.merges, b.token_types)


def test_large_synth_vocab_fills_past_the_learned_merges_with_printable_words():
    v = synth_vocab(9000)
    assert len(v.tokens) == len(set(v.tokens)) == 9000
    assert v.tokens[-len(SPECIAL_TOKENS) :] == [t for t, _ in SPECIAL_TOKENS]
    fillers = v.tokens[256 + len(v.merges) : -len(SPECIAL_TOKENS)]
    assert fillers and all(t.startswith("Ġ") and t[1:].isalpha() for t in fillers)


def test_synth_vocab_refuses_tiny_sizes():
    with pytest.raises(ValueError, match="too small"):
        synth_vocab(300)


# ---- encode / decode ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_encode_then_decode_gives_back_the_text(tok, text):
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode(text, parse_special=False)) == text


def test_ids_are_within_the_vocabulary_and_merges_are_used(tok):
    ids = tok.encode("The model routes every token to a few experts.")
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert len(ids) < len("The model routes every token to a few experts.") / 2


def test_metadata_fields_come_through(tok):
    v = synth_vocab(N_VOCAB)
    assert tok.vocab_size == N_VOCAB
    assert tok.bos_id == tok.eos_id == v.special["<|endoftext|>"]
    assert tok.eos_ids == {v.special["<|endoftext|>"], v.special["<|im_end|>"]}
    assert tok.encode("hi") == tok.encode("hi", add_bos=False)  # GGUF says add_bos false
    assert tok.encode("hi", add_bos=True) == [tok.bos_id, *tok.encode("hi")]


def test_special_tokens_are_single_ids(tok):
    sp = synth_vocab(N_VOCAB).special
    ids = tok.encode("<|im_start|>user\nhi<|im_end|><think>x</think>")
    assert ids[0] == sp["<|im_start|>"]
    assert sp["<|im_end|>"] in ids and sp["<think>"] in ids and sp["</think>"] in ids
    assert all(tok.is_special(i) for i in sp.values())
    assert not tok.is_special(ids[1])


def test_parse_special_false_spells_control_tokens_but_keeps_user_defined_ones(tok):
    sp = synth_vocab(N_VOCAB).special
    ids = tok.encode("<|im_end|><think>", parse_special=False)
    assert sp["<|im_end|>"] not in ids
    assert ids[-1] == sp["<think>"]  # USER_DEFINED tokens always match, as in llama.cpp


def test_decode_skip_special_drops_control_tokens_only(tok):
    ids = tok.encode("<|im_start|>assistant\n<think>hm</think>ok<|im_end|>")
    assert tok.decode(ids, skip_special=True) == "assistant\n<think>hm</think>ok"


def test_token_bytes_concatenate_to_the_utf8_text(tok):
    text = "naïve 中文 🦙"
    assert b"".join(tok.token_bytes(i) for i in tok.encode(text)) == text.encode()


def test_stream_decoder_holds_back_split_multibyte_characters(tok):
    text = "a🦙b中\u0378"
    ids = tok.encode(text)
    split = [i for i in ids if len(tok.token_bytes(i).decode("utf-8", "ignore")) == 0]
    assert split, "expected some tokens that carry only part of a character"
    dec = tok.stream()
    pieces = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert list(tok.stream().feed(ids)) == [p for p in pieces if p]


def test_stream_decoder_flush_marks_a_truncated_character(tok):
    ids = tok.encode("🦙")
    dec = tok.stream()
    assert [dec.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert dec.flush() == "\ufffd"


def test_control_looking_tokens_are_retyped_as_llama_cpp_does(tmp_path):
    ours = Tokenizer.from_metadata(
        GGUFModel(_write_vocab_gguf(tmp_path / "x.gguf", extra=True)).metadata
    )
    tid = {t: ours.token_id(t) for t, _ in EXTRA_TOKENS}
    assert all(ours.is_control(tid[t]) for t in ("</s>", "<|fim_prefix|>", "<|file_sep|>"))
    assert {tid["</s>"], tid["<|fim_pad|>"], tid["<|file_sep|>"]} <= ours.eos_ids
    assert ours.is_special(tid["<tool_call>"]) and not ours.is_control(tid["<tool_call>"])
    assert ours.encode("<tool_call>", parse_special=False) == [tid["<tool_call>"]]
    assert ours.token_bytes(tid["[PAD7]"]) == b""


# ---- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("pre", ["qwen2", "qwen35", "llama3", "gpt-2"])
def test_a_long_text_tokenized_in_pieces_gives_the_ids_of_the_whole(meta, pre, monkeypatch):
    tok = Tokenizer.from_metadata({**meta, Keys.Tokenizer.PRE: pre})
    monkeypatch.setattr(tokenizer_module, "CHUNK_CHARS", 8)  # a cut every few words
    rng = random.Random(48)
    seps = [" ", "  ", "\n", " \n ", "", "\t", ". ", "'s ", "1 ", " 2"]
    for _ in range(30):
        text = "".join(rng.choice(TEXTS + EXTRA_TEXTS) + rng.choice(seps) for _ in range(12))
        whole = tok._hf.encode_batch([text], add_special_tokens=False)[0].ids
        assert len(list(tok._parts(text))) > 1 or len(text) <= 16
        assert tok.encode(text, add_bos=False) == whole
        assert tok.encode(text, add_bos=False, parse_special=False) == (
            tok._plain().encode_batch([text], add_special_tokens=False)[0].ids
        )
        prefix = tok.encode(text, add_bos=False, stop_after=20)
        assert len(prefix) > 20 and whole[: len(prefix)] == prefix or prefix == whole


def test_encode_lets_other_threads_run(tok):
    """A long prompt tokenizes without holding the GIL (the server's event loop keeps going)."""
    text = "".join(TEXTS[:6]) * 3000  # about 1 MB: tenths of a second to tokenize
    ticks, done = [0], threading.Event()

    def tick():
        while not done.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    t = threading.Thread(target=tick)
    t.start()
    try:
        for _ in range(3):
            tok.encode(text)
    finally:
        done.set()
        t.join()
    assert ticks[0] >= 50  # holding the GIL, it would tick only between the calls


def test_non_bpe_tokenizer_model_is_refused(meta):
    with pytest.raises(ModelError, match="'llama' is not supported"):
        Tokenizer.from_metadata({**meta, Keys.Tokenizer.MODEL: "llama"})


def test_unknown_pre_tokenizer_is_refused(meta):
    with pytest.raises(ModelError, match="pre-tokenizer 'chameleon'"):
        Tokenizer.from_metadata({**meta, Keys.Tokenizer.PRE: "chameleon"})


# ---- chat template -----------------------------------------------------------------------------

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2+2?"},
]


def test_render_chat_gives_chatml_with_a_generation_prompt():
    out = render_chat(MESSAGES, None)
    assert out == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert render_chat(MESSAGES, CHATML_TEMPLATE, add_generation_prompt=False) == out[:-22]


def test_qwen3_template_matches_chatml_and_can_switch_thinking_off():
    assert render_chat(MESSAGES, QWEN3_CHAT_TEMPLATE) == render_chat(MESSAGES, None)
    off = render_chat(MESSAGES, QWEN3_CHAT_TEMPLATE, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_qwen3_template_drops_old_reasoning_from_history():
    msgs = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nA"},
        {"role": "user", "content": "b"},
    ]
    out = render_chat(msgs, QWEN3_CHAT_TEMPLATE)
    assert "<|im_start|>assistant\nA<|im_end|>" in out and "hmm" not in out


def test_the_gguf_carries_the_chat_template(meta):
    assert meta[Keys.Tokenizer.CHAT_TEMPLATE] == QWEN3_CHAT_TEMPLATE


def test_template_helpers_tojson_keeps_unicode_and_strftime_now_works():
    tpl = "{{ messages[0] | tojson }}|{{ strftime_now('%Y') | length }}"
    out = render_chat([{"role": "user", "content": "héllo 中"}], tpl)
    assert out == json.dumps({"role": "user", "content": "héllo 中"}, ensure_ascii=False) + "|4"


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        ("{% for m in messages %}", "does not parse"),
        ("{{ raise_exception('no system role') }}", "no system role"),
        ("{{ messages[0].content + 1 }}", "chat template failed"),
        ("{{ ''.__class__.__mro__ }}", "chat template failed"),
    ],
)
def test_template_errors_are_one_line_value_errors(template, reason):
    with pytest.raises(ValueError, match=reason) as e:
        render_chat(MESSAGES, template)
    assert "\n" not in str(e.value)


# ---- llama.cpp oracle --------------------------------------------------------------------------

PRES = ["qwen2", "llama-bpe", "gpt-2", "qwen35", "qwen2+extra"]


@pytest.fixture(scope="module")
def llama_vocab(tmp_path_factory):
    """name -> (llama_cpp.Llama vocab-only, our Tokenizer) on the same GGUF."""
    llama_cpp = pytest.importorskip("llama_cpp")
    loaded = {}
    for name in PRES:
        pre, _, extra = name.partition("+")
        path = tmp_path_factory.mktemp("vocab") / f"{pre}.gguf"
        _write_vocab_gguf(path, pre=pre, extra=bool(extra))
        try:
            llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        except ValueError:
            if pre == "qwen2":
                raise
            continue  # this llama.cpp build predates the pre-tokenizer
        loaded[name] = (llm, Tokenizer.from_metadata(GGUFModel(path).metadata))
    return loaded


def _pair(llama_vocab, name):
    if name not in llama_vocab:
        pytest.skip(f"llama.cpp build does not know pre-tokenizer {name!r}")
    return llama_vocab[name]


def _llama_pieces(llm, ids, special: bool) -> bytes:
    """llama.cpp's bytes for `ids` (token_to_piece per token; `Llama.detokenize` also strips
    a space after a leading BOS, which is llama-cpp-python's, not llama.cpp's)."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    buf = ctypes.create_string_buffer(256)
    out = []
    for i in ids:
        n = llama_cpp.llama_token_to_piece(vocab, i, buf, len(buf), 0, special)
        out.append(buf.raw[:n])
    return b"".join(out)


@pytest.mark.llama
@pytest.mark.parametrize("name", PRES)
def test_ids_are_identical_to_llama_cpp(llama_vocab, name):
    llm, ours = _pair(llama_vocab, name)
    for text in TEXTS + EXTRA_TEXTS:
        for special in (True, False):
            ref = llm.tokenize(text.encode(), add_bos=False, special=special)
            assert ours.encode(text, add_bos=False, parse_special=special) == ref, (text, special)


@pytest.mark.llama
@pytest.mark.parametrize("name", ["qwen2", "qwen2+extra"])
def test_detokenize_is_identical_to_llama_cpp(llama_vocab, name):
    llm, ours = _pair(llama_vocab, name)
    for text in TEXTS + EXTRA_TEXTS:
        ids = ours.encode(text)
        assert ours.decode_bytes(ids) == _llama_pieces(llm, ids, special=True), text
        assert ours.decode_bytes(ids, skip_special=True) == _llama_pieces(llm, ids, False), text
    assert ours.decode_bytes(range(ours.vocab_size)) == _llama_pieces(
        llm, range(ours.vocab_size), special=True
    )


@pytest.mark.llama
@pytest.mark.parametrize("name", ["qwen2", "qwen2+extra"])
def test_end_of_generation_ids_are_those_of_llama_cpp(llama_vocab, name):
    import llama_cpp

    llm, ours = _pair(llama_vocab, name)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    ref = {i for i in range(ours.vocab_size) if llama_cpp.llama_vocab_is_eog(vocab, i)}
    assert ours.eos_ids == ref
    assert llm.token_bos() == ours.bos_id and llm.token_eos() == ours.eos_id
    if name.endswith("extra"):
        assert {ours.token_text(i) for i in ref} >= {"</s>", "<|fim_pad|>", "<|file_sep|>"}
