"""OpenAI request parsing and validation, and the error builder (responses: responses.py).

Every malformed request becomes an `APIError` that the app turns into OpenAI's error shape,
`{"error": {"message", "type", "param", "code"}}`, with HTTP 400 unless said otherwise.

Sampling defaults are llama.cpp server's (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05),
since the sampler is llama.cpp's chain. Accepted and ignored, for clients that always send them:
`user`, `metadata`, `store`, `service_tier`, `presence_penalty`, `frequency_penalty`,
`repeat_penalty`, `logit_bias`, `parallel_tool_calls` (the parser always accepts several calls).
Refused with 400 because they would otherwise be silently wrong: `n` other than 1, `best_of`
other than 1, `logprobs`/`top_logprobs`, `suffix`, `response_format` other than text,
`tool_choice` "required" or a named function (no constrained decoding yet), non-text content parts.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from strata.engine.sampling import SamplingParams
from strata.serve.reasoning import EFFORTS

MAX_STOP = 16
MAX_STOP_CHARS = 1000  # the session rescans each stop string's prefixes every token
ROLES = ("system", "developer", "user", "assistant", "tool")


class APIError(Exception):
    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.type = message, status, type
        self.param, self.code, self.headers = param, code, headers

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(
    message: str,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(raw: bytes) -> dict:
    """The request body as a JSON object; APIError(400) for anything else."""
    try:
        obj = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        msg = " ".join(str(e).split())[:200]
        raise APIError(
            f"could not parse the JSON body of the request: {msg}", code="invalid_json"
        ) from None
    if not isinstance(obj, dict):
        raise APIError("the request body must be a JSON object", code="invalid_json")
    return obj


# ---- field readers -----------------------------------------------------------------------------

_MISSING = object()


def _type_error(param: str, want: str, got: Any) -> APIError:
    return APIError(
        f"{param}: expected {want}, got {type(got).__name__} {_short(got)}",
        param=param,
        code="invalid_type",
    )


def _short(v: Any) -> str:
    try:
        s = json.dumps(v)
    except (TypeError, ValueError):
        s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _value_error(param: str, msg: str) -> APIError:
    return APIError(f"{param}: {msg}", param=param, code="invalid_value")


def get_int(
    body: dict, key: str, default: Any = None, *, lo: int | None = None, hi: int | None = None
) -> Any:
    v = body.get(key, _MISSING)
    if v is _MISSING or v is None:
        return default
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise _type_error(key, "an integer", v)
    if lo is not None and v < lo:
        raise _value_error(key, f"must be >= {lo}, got {v}")
    if hi is not None and v > hi:
        raise _value_error(key, f"must be <= {hi}, got {v}")
    return v


def get_float(
    body: dict,
    key: str,
    default: Any = None,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
) -> Any:
    v = body.get(key, _MISSING)
    if v is _MISSING or v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise _type_error(key, "a number", v)
    v = float(v)
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise _value_error(key, f"must be {'>' if lo_open else '>='} {lo}, got {v}")
    if hi is not None and v > hi:
        raise _value_error(key, f"must be <= {hi}, got {v}")
    return v


def get_bool(body: dict, key: str, default: Any = False) -> Any:
    v = body.get(key, _MISSING)
    if v is _MISSING or v is None:
        return default
    if not isinstance(v, bool):
        raise _type_error(key, "a boolean", v)
    return v


def get_str(body: dict, key: str, default: Any = None) -> Any:
    v = body.get(key, _MISSING)
    if v is _MISSING or v is None:
        return default
    if not isinstance(v, str):
        raise _type_error(key, "a string", v)
    return v


# ---- common request parts ----------------------------------------------------------------------


def parse_sampling(body: dict) -> SamplingParams:
    top_k = get_int(body, "top_k", 40, lo=-1)
    seed = get_int(body, "seed")
    return SamplingParams(
        temperature=get_float(body, "temperature", 0.8, lo=0.0, hi=2.0),
        top_k=0 if top_k == -1 else top_k,  # vLLM's -1 = off
        top_p=get_float(body, "top_p", 0.95, lo=0.0, hi=1.0, lo_open=True),
        min_p=get_float(body, "min_p", 0.05, lo=0.0, hi=1.0),
        seed=None if seed is None else seed % 2**64,
    )


def parse_stop(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise _type_error("stop", "a string or a list of strings", v)
    if len(v) > MAX_STOP:
        raise _value_error("stop", f"at most {MAX_STOP} stop strings, got {len(v)}")
    if any(len(s) > MAX_STOP_CHARS for s in v):
        raise _value_error("stop", f"a stop string is longer than {MAX_STOP_CHARS} characters")
    return [s for s in v if s]


def parse_stream(body: dict) -> tuple[bool, bool]:
    stream = get_bool(body, "stream", False)
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise _type_error("stream_options", "an object", opts)
        include_usage = get_bool(opts, "include_usage", False)
    return stream, include_usage


def _refuse_unsupported(body: dict, *, chat: bool) -> None:
    n = get_int(body, "n", 1)
    if n != 1:
        raise _value_error("n", f"only n=1 is supported, got {n}")
    if not chat:
        best_of = get_int(body, "best_of", 1)
        if best_of != 1:
            raise _value_error("best_of", f"only best_of=1 is supported, got {best_of}")
        if body.get("suffix") not in (None, ""):
            raise _value_error("suffix", "suffix (fill-in-the-middle) is not supported")
    lp = body.get("logprobs")
    if lp not in (None, False, 0):
        raise _value_error("logprobs", "log probabilities are not supported")
    if body.get("top_logprobs") not in (None, 0):
        raise _value_error("top_logprobs", "log probabilities are not supported")
    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
            raise _type_error("response_format", 'an object like {"type": "text"}', rf)
        if rf["type"] != "text":
            raise _value_error(
                "response_format", f"only type 'text' is supported, got {rf['type']!r}"
            )
    get_str(body, "model")


# ---- chat --------------------------------------------------------------------------------------


def _content_text(content: Any, param: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            p = f"{param}[{i}]"
            if not isinstance(part, dict):
                raise _type_error(p, "a content part object", part)
            if part.get("type") != "text":
                raise _value_error(
                    p, f"only text content parts are supported, got {_short(part.get('type'))}"
                )
            if not isinstance(part.get("text"), str):
                raise _type_error(f"{p}.text", "a string", part.get("text"))
            parts.append(part["text"])
        return "\n".join(parts)
    raise _type_error(param, "a string or a list of content parts", content)


def _tool_calls(v: Any, param: str) -> list[dict]:
    if not isinstance(v, list):
        raise _type_error(param, "a list", v)
    out = []
    for i, tc in enumerate(v):
        p = f"{param}[{i}]"
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _type_error(
                p, 'an object like {"type": "function", "function": {"name": ...}}', tc
            )
        args = fn.get("arguments", "{}")
        if isinstance(args, str):  # templates expect a mapping, as HF transformers passes it
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                pass
        elif not isinstance(args, dict):
            raise _type_error(f"{p}.function.arguments", "a JSON string", args)
        out.append(
            {
                "id": tc.get("id") if isinstance(tc.get("id"), str) else f"call_{i}",
                "type": "function",
                "function": {"name": fn["name"], "arguments": args},
            }
        )
    return out


def parse_messages(v: Any) -> list[dict]:
    """Messages normalized for templates: string content, `developer` as `system`."""
    if v is None:
        raise APIError(
            "missing required parameter: 'messages'",
            param="messages",
            code="missing_required_parameter",
        )
    if not isinstance(v, list):
        raise _type_error("messages", "a list of messages", v)
    if not v:
        raise _value_error("messages", "at least one message is required")
    out = []
    for i, m in enumerate(v):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _type_error(p, "a message object", m)
        role = m.get("role")
        if role not in ROLES:
            raise _value_error(
                f"{p}.role", f"must be one of {', '.join(ROLES)}, got {_short(role)}"
            )
        content = _content_text(m.get("content"), f"{p}.content")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role}
        if role == "assistant" and m.get("tool_calls") is not None:
            msg["tool_calls"] = _tool_calls(m["tool_calls"], f"{p}.tool_calls")
        elif content is None:
            raise _type_error(f"{p}.content", "a string or a list of content parts", None)
        msg["content"] = content or ""
        if isinstance(m.get("reasoning_content"), str):
            msg["reasoning_content"] = m["reasoning_content"]
        if role == "tool":
            msg["tool_call_id"] = get_str(m, "tool_call_id", "")
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        out.append(msg)
    return out


def parse_tools(body: dict) -> tuple[list[dict] | None, str]:
    """(tools or None, tool_choice in {"auto", "none"})."""
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise _type_error("tools", "a list of tools", tools)
        for i, t in enumerate(tools):
            fn = t.get("function") if isinstance(t, dict) else None
            if (
                not isinstance(t, dict)
                or t.get("type", "function") != "function"
                or not isinstance(fn, dict)
                or not isinstance(fn.get("name"), str)
            ):
                raise _type_error(
                    f"tools[{i}]",
                    'an object like {"type": "function", "function": {"name": ...}}',
                    t,
                )
        tools = tools or None
    choice = body.get("tool_choice")
    if choice is None:
        choice = "auto"
    elif choice in ("required",) or isinstance(choice, dict):
        raise _value_error(
            "tool_choice",
            "only 'auto' and 'none' are supported (forcing a call "
            "needs constrained decoding, which Strata does not have yet)",
        )
    elif choice not in ("auto", "none"):
        raise _value_error("tool_choice", f"must be 'auto' or 'none', got {_short(choice)}")
    return tools, choice


@dataclass
class ChatRequest:
    messages: list[dict]
    max_tokens: int | None
    sampling: SamplingParams
    stop: list[str]
    stream: bool = False
    include_usage: bool = False
    tools: list[dict] | None = None
    tool_choice: str = "auto"
    reasoning_effort: str | None = None
    model: str | None = None


def parse_chat(body: dict) -> ChatRequest:
    _refuse_unsupported(body, chat=True)
    messages = parse_messages(body.get("messages"))
    max_tokens = get_int(body, "max_completion_tokens", None, lo=1)
    if max_tokens is None:
        max_tokens = get_int(body, "max_tokens", None, lo=1)
    stream, include_usage = parse_stream(body)
    tools, choice = parse_tools(body)
    effort = get_str(body, "reasoning_effort")
    if effort is not None and effort not in EFFORTS:
        raise _value_error(
            "reasoning_effort", f"must be one of {', '.join(EFFORTS)}, got {_short(effort)}"
        )
    return ChatRequest(
        messages,
        max_tokens,
        parse_sampling(body),
        parse_stop(body),
        stream,
        include_usage,
        tools,
        choice,
        effort,
        body.get("model"),
    )


# ---- completions -------------------------------------------------------------------------------


@dataclass
class CompletionRequest:
    prompt: str | list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: list[str]
    stream: bool = False
    include_usage: bool = False
    echo: bool = False
    model: str | None = None


def _is_ids(v: Any) -> bool:
    return (
        isinstance(v, list)
        and bool(v)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in v)
    )


def parse_prompt(v: Any) -> str | list[int]:
    if v is None:
        raise APIError(
            "missing required parameter: 'prompt'",
            param="prompt",
            code="missing_required_parameter",
        )
    if isinstance(v, list) and len(v) == 1 and (isinstance(v[0], str) or _is_ids(v[0])):
        v = v[0]  # a batch of one
    if isinstance(v, str):
        if not v:
            raise _value_error("prompt", "the prompt is empty")
        return v
    if _is_ids(v):
        return v
    if isinstance(v, list) and len(v) > 1 and all(isinstance(p, str) or _is_ids(p) for p in v):
        raise _value_error("prompt", "only one prompt per request is supported")
    raise _type_error("prompt", "a string or a list of token ids", v)


def parse_completion(body: dict) -> CompletionRequest:
    _refuse_unsupported(body, chat=False)
    stream, include_usage = parse_stream(body)
    return CompletionRequest(
        prompt=parse_prompt(body.get("prompt")),
        max_tokens=get_int(body, "max_tokens", 16, lo=1),
        sampling=parse_sampling(body),
        stop=parse_stop(body),
        stream=stream,
        include_usage=include_usage,
        echo=get_bool(body, "echo", False),
        model=body.get("model"),
    )
