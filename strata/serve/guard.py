"""Guards on what a request may ask of the server before it costs anything: text that cannot be
encoded, prompts too long for the context, and model names the server does not serve.

JSON allows escapes such as "\\ud800" that decode to lone surrogates, which no tokenizer (and no
UTF-8 response) can take: `check_encodable` finds the first one anywhere in the body and names
its field. `prompt_bytes_fit` refuses a prompt that cannot fit without tokenizing it: no token
stands for more bytes than the vocabulary's longest one, so a prompt of more than
`tokens * longest` UTF-8 bytes has more than `tokens` tokens.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from strata.serve.schemas import APIError

_SHARD = re.compile(r"-\d{5}-of-\d{5}$")


def _surrogate(s: str) -> int | None:
    """Index of the first character that UTF-8 cannot encode (a lone surrogate), or None."""
    if s.isascii():
        return None
    try:
        s.encode()
    except UnicodeEncodeError as e:
        return e.start
    return None


def _refuse(param: str, s: str, at: int) -> APIError:
    return APIError(
        f"{param}: the text is not valid Unicode (a lone surrogate U+{ord(s[at]):04X} at "
        f"character {at}); send UTF-8 text",
        param=param,
        code="invalid_encoding",
    )


def check_encodable(obj: Any, param: str = "") -> None:
    """APIError(400) naming the field of the first string (or key) UTF-8 cannot encode.

    Iterative, so a body nested as deep as the JSON parser allows cannot overflow the stack;
    a field's name is spelled out only for the error.
    """
    stack: list[tuple[Any, Any]] = [(None, obj)]  # (path as nested (parent, key) pairs, value)
    while stack:
        where, v = stack.pop()
        if isinstance(v, str):
            at = _surrogate(v)
            if at is not None:
                raise _refuse(_spell(where, param), v, at)
        elif isinstance(v, dict):
            for k, x in reversed(v.items()):  # the first field is checked first
                at = _surrogate(k)
                if at is not None:
                    raise _refuse(_spell(where, param), k, at)
                if isinstance(x, str | dict | list):
                    stack.append(((where, k), x))
        elif isinstance(v, list):
            for i in range(len(v) - 1, -1, -1):
                if isinstance(v[i], str | dict | list):
                    stack.append(((where, i), v[i]))


def _spell(where: Any, root: str) -> str:
    keys = []
    while where is not None:
        where, key = where
        keys.append(key)
    out = root
    for key in reversed(keys):
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out or "body"


def utf8_len(text: str, param: str) -> int:
    """UTF-8 length of prompt text; APIError(400) if the text cannot be encoded."""
    try:
        return len(text.encode())
    except UnicodeEncodeError as e:
        raise _refuse(param, text, e.start) from None


def longest_token_bytes(tokenizer) -> int:
    """Bytes of the vocabulary's longest token: the most text one prompt token can stand for."""
    return max(1, max(len(tokenizer.token_bytes(i)) for i in range(tokenizer.vocab_size)))


def prompt_bytes_fit(nbytes: int, n_ctx: int, longest: int, param: str) -> None:
    """APIError(400, context_length_exceeded) when `nbytes` of prompt text cannot fit: a prompt
    needs at least one token of room after it. Closer limits (max_tokens) are checked on the
    token count, which this bound keeps cheap to compute."""
    room = n_ctx - 1
    if nbytes > room * longest:
        raise APIError(
            f"This model's maximum context length is {n_ctx} tokens. However, your prompt is "
            f"{nbytes} bytes, more than {room} tokens can hold (no token is longer than "
            f"{longest} bytes). Please reduce the prompt.",
            param=param,
            code="context_length_exceeded",
        )


def model_names(model_id: str, path: str | Path) -> frozenset[str]:
    """The names a request's `model` may use: the served id, the file's name, its stem, and the
    stem without a shard suffix (`-00001-of-00003`)."""
    p = Path(path)
    return frozenset({model_id, p.name, p.stem, _SHARD.sub("", p.stem)})


def unknown_model(requested: str, served: str) -> APIError:
    return APIError(
        f"The model `{requested}` does not exist or you do not have access to it. This server "
        f"serves `{served}`.",
        status=404,
        param="model",
        code="model_not_found",
    )


def check_model(requested: str | None, names: frozenset[str], served: str) -> None:
    """APIError(404, model_not_found) for a `model` the server does not serve; absent is fine."""
    if requested and requested not in names:
        raise unknown_model(requested, served)
