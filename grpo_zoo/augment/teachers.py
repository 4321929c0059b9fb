"""Teachers that write paraphrases and step-by-step solutions: a local HF model or a chat endpoint.

DIVA-GRPO (arXiv 2603.01106) generates its variant material offline with a closed teacher;
here any model works:
- LocalTeacher: a local Hugging Face model (text or vision-language) through grpo_zoo's Policy,
  batched generate; images go to it only when it is a vision-language model.
- EndpointTeacher: any OpenAI-compatible `POST .../chat/completions` server (vLLM, SGLang,
  llama.cpp, a hosted API), standard library only, requests in a thread pool; images are sent
  as base64 PNG data URLs unless the teacher is marked text-only.
A teacher answers every request with a TeacherReply: the text, or None and the error after its
retries (the row is then left un-augmented, never dropped).
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import logging
import os
import random
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from PIL import Image

from grpo_zoo.augment.config import TeacherConfig

log = logging.getLogger(__name__)

_RETRY_STATUS = {408, 409, 425, 429}  # plus every 5xx: the server may recover; other 4xx will not


@dataclass
class TeacherRequest:
    """One chat turn for the teacher: the user text and the images shown before it."""

    text: str
    images: list[Image.Image] = field(default_factory=list)


@dataclass
class TeacherReply:
    """The teacher's answer text, or None with the reason when the request failed for good."""

    text: str | None
    error: str | None = None


class Teacher(Protocol):
    """What the runner needs from a teacher."""

    supports_images: bool  # whether images are passed on (a text-only teacher sees only the text)
    batch_size: int  # requests worth sending at once

    def complete(self, requests: Sequence[TeacherRequest]) -> list[TeacherReply]:
        """One reply per request, in order; never raises for a single failed request."""
        ...

    def close(self) -> None: ...


class LocalTeacher:
    """A local Hugging Face model run with transformers (grpo_zoo.policy.Policy), batched."""

    def __init__(self, policy: Any, cfg: TeacherConfig):
        self.policy = policy
        self.cfg = cfg
        self.supports_images = bool(policy.is_vlm)
        self.batch_size = cfg.batch_size

    @classmethod
    def from_config(cls, cfg: TeacherConfig) -> LocalTeacher:
        """Load cfg.source (a local model directory; never downloads)."""
        from grpo_zoo.policy import Policy

        return cls(Policy.from_pretrained(cfg.source, device=cfg.device, dtype=cfg.dtype), cfg)

    def complete(self, requests: Sequence[TeacherRequest]) -> list[TeacherReply]:
        replies: list[TeacherReply] = []
        for start in range(0, len(requests), self.batch_size):
            chunk = list(requests[start : start + self.batch_size])
            try:
                replies.extend(TeacherReply(t) for t in self._generate(chunk))
            except (ValueError, RuntimeError) as exc:  # e.g. out of memory: isolate the request at fault
                if len(chunk) == 1:
                    replies.append(TeacherReply(None, f"{type(exc).__name__}: {exc}"[:300]))
                else:
                    log.warning("local teacher batch failed (%s); retrying its %d requests one by one", exc, len(chunk))
                    replies.extend(self.complete_one_by_one(chunk))
        return replies

    def complete_one_by_one(self, requests: Sequence[TeacherRequest]) -> list[TeacherReply]:
        out = []
        for request in requests:
            try:
                out.append(TeacherReply(self._generate([request])[0]))
            except (ValueError, RuntimeError) as exc:
                out.append(TeacherReply(None, f"{type(exc).__name__}: {exc}"[:300]))
        return out

    def _generate(self, requests: list[TeacherRequest]) -> list[str]:
        from grpo_zoo.types import Prompt

        prompts = [Prompt(question_id=i, problem=r.text, answer="",
                          images=list(r.images) if self.supports_images else [])
                   for i, r in enumerate(requests)]
        encoded = self.policy.encode(prompts, system_prompt=self.cfg.system_prompt)
        greedy = self.cfg.temperature == 0
        rollout = self.policy.generate(encoded, group_size=1, temperature=self.cfg.temperature or 1.0,
                                       top_p=self.cfg.top_p, max_new_tokens=self.cfg.max_new_tokens, greedy=greedy)
        return list(rollout.response_texts)

    def close(self) -> None:
        pass


class _Retryable(Exception):
    """A failure worth another try (timeout, connection, 408/429/5xx, unreadable body)."""

    def __init__(self, message: str, wait_s: float | None = None):
        super().__init__(message)
        self.wait_s = wait_s  # the server's Retry-After, if it sent one


class EndpointTeacher:
    """An OpenAI-compatible chat-completions server given by URL, `cfg.workers` requests in flight."""

    def __init__(self, cfg: TeacherConfig, *, sleep: Any = time.sleep):
        self.cfg = cfg
        self.url = chat_url(cfg.source)
        self.supports_images = cfg.vision
        self.batch_size = cfg.workers
        self._sleep = sleep
        key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
        self._headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        self.model = cfg.model or self._served_model()
        self._pool = ThreadPoolExecutor(max_workers=cfg.workers, thread_name_prefix="grpo-zoo-teacher")

    def _served_model(self) -> str:
        """The first model GET /models lists (a vLLM server serves one)."""
        url = self.url.rsplit("/chat/completions", 1)[0] + "/models"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=self._headers),
                                        timeout=self.cfg.timeout_s) as response:
                return str(json.loads(response.read())["data"][0]["id"])
        except (OSError, ValueError, KeyError, IndexError, TypeError, http.client.HTTPException) as exc:
            raise ValueError(f"teacher endpoint {url}: cannot list its models ({exc}); pass the model name "
                             "with --teacher-model") from None

    def complete(self, requests: Sequence[TeacherRequest]) -> list[TeacherReply]:
        return list(self._pool.map(self._complete_one, requests))

    def _complete_one(self, request: TeacherRequest) -> TeacherReply:
        body = json.dumps(self._payload(request)).encode()
        error, wait = "", 0.0
        for attempt in range(self.cfg.max_retries + 1):
            if attempt:
                self._sleep(wait)
            try:
                return TeacherReply(self._post(body))
            except _Retryable as exc:
                error = str(exc)
                backoff = min(self.cfg.backoff_s * 2**attempt, self.cfg.max_backoff_s)
                backoff *= random.uniform(0.5, 1.0)  # jitter: workers do not retry in lockstep
                wait = backoff if exc.wait_s is None else min(exc.wait_s, self.cfg.max_backoff_s)
            except urllib.error.HTTPError as exc:  # a 4xx that retrying cannot fix (bad request, auth)
                return TeacherReply(None, f"HTTP {exc.code}: {_error_body(exc)}")
        return TeacherReply(None, f"{error} (gave up after {self.cfg.max_retries + 1} attempts)")

    def _payload(self, request: TeacherRequest) -> dict[str, Any]:
        images = request.images if self.supports_images else []
        content: Any = request.text
        if images:
            content = [{"type": "image_url", "image_url": {"url": image_data_url(im)}} for im in images]
            content.append({"type": "text", "text": request.text})
        messages = [{"role": "system", "content": self.cfg.system_prompt}] if self.cfg.system_prompt else []
        messages.append({"role": "user", "content": content})
        return {"model": self.model, "messages": messages, "temperature": self.cfg.temperature,
                "top_p": self.cfg.top_p, "max_tokens": self.cfg.max_new_tokens, "n": 1}

    def _post(self, body: bytes) -> str:
        """The reply text; raises _Retryable, or HTTPError for a final 4xx."""
        request = urllib.request.Request(self.url, data=body, headers=self._headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.cfg.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            if exc.code in _RETRY_STATUS or exc.code >= 500:
                raise _Retryable(f"HTTP {exc.code}: {_error_body(exc)}", _retry_after(exc)) from None
            raise
        except (TimeoutError, OSError, http.client.HTTPException) as exc:  # URLError is an OSError
            reason = getattr(exc, "reason", exc)
            kind = "timeout" if isinstance(reason, TimeoutError) or "timed out" in str(reason) else "connection error"
            raise _Retryable(f"{kind}: {reason}") from None
        try:
            message = json.loads(raw)["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise _Retryable(f"unreadable response body: {raw[:200]!r}") from None
        content = message.get("content") if isinstance(message, dict) else None
        return content if isinstance(content, str) else ""  # no text (e.g. a refusal): the gates reject it

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def chat_url(source: str) -> str:
    """The chat-completions URL for a server address: `http://host:8000` and `.../v1` both work."""
    parsed = urllib.parse.urlsplit(source)
    path = parsed.path.rstrip("/")
    if not path.endswith("/chat/completions"):
        path = (path or "/v1") + "/chat/completions"
    return urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, path, parsed.query, ""))


def image_data_url(image: Image.Image) -> str:
    """A PNG data URL, the image form every OpenAI-compatible vision server accepts."""
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _error_body(exc: urllib.error.HTTPError) -> str:
    try:
        return exc.read()[:200].decode(errors="replace")
    except Exception:  # the body is only for the message
        return exc.reason if isinstance(exc.reason, str) else ""


def _retry_after(exc: urllib.error.HTTPError) -> float | None:
    try:
        return float(exc.headers.get("Retry-After", ""))
    except (TypeError, ValueError):
        return None


def make_teacher(cfg: TeacherConfig) -> Teacher:
    """An EndpointTeacher for an http(s) URL, else a LocalTeacher for a model directory."""
    if not cfg.source:
        raise ValueError("no teacher: pass --teacher with a local model directory or an http(s) endpoint URL")
    return EndpointTeacher(cfg) if cfg.is_endpoint else LocalTeacher.from_config(cfg)


__all__ = ["EndpointTeacher", "LocalTeacher", "Teacher", "TeacherReply", "TeacherRequest", "chat_url", "make_teacher"]
