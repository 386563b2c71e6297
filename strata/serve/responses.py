"""OpenAI response bodies: ids, usage, and the envelope every response and chunk shares."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int, reused_tokens: int = 0) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": reused_tokens},
    }


@dataclass
class Envelope:
    """What every response and chunk of one request shares."""

    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    def chat(self, message: dict, finish_reason: str | None, usage_: dict) -> dict:
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "strata",
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
            ],
            "usage": usage_,
        }

    def chat_chunk(
        self,
        delta: dict | None,
        finish_reason: str | None = None,
        usage_: dict | None = None,
        *,
        with_usage_field: bool = False,
    ) -> dict:
        d: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "strata",
            "choices": []
            if delta is None
            else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        if usage_ is not None or with_usage_field:
            d["usage"] = usage_
        return d

    def completion(
        self,
        text: str | None,
        finish_reason: str | None,
        usage_: dict | None = None,
        *,
        chunk: bool = False,
        with_usage_field: bool = False,
    ) -> dict:
        d: dict[str, Any] = {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "strata",
            "choices": []
            if text is None
            else [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
        }
        if not chunk or usage_ is not None or with_usage_field:
            d["usage"] = usage_
        return d
