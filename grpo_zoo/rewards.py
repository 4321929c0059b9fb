"""Built-in reward functions: accuracy (math-verify), format and exact match.

A reward function is a plain callable `fn(response: str, answer: str, **context) -> float` that
returns a finite value in [0, 1]; the engine weights and sums them (reward.functions in the
recipe; the default is 0.9 accuracy + 0.1 format, the R1 / DIVA-GRPO recipe). `context` carries
per-response extras (e.g. the question's metadata) that a function may use or ignore.
Time limits and error handling live in grpo_zoo.reward_runner, not here: these functions are
pure and may be slow on adversarial LaTeX, which is why the runner calls them in worker
processes.

Only the LAST \\boxed{...} of a response is graded: math-verify treats several boxes as a set
that never equals a single gold answer, and the last box is the model's final answer.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from grpo_zoo.registry import REWARDS

_BOXED = re.compile(r"\\boxed\s*\{")
_INTEGER = re.compile(r"[+-]?\d+")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\s*\{")


def _closing_brace(text: str, start: int) -> int | None:
    """Index of the brace closing the one opened just before `start`, or None if unbalanced.

    Escaped braces (\\{ and \\}) are LaTeX set delimiters, not grouping, so they are skipped.
    """
    depth = 1
    i = start
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2  # skip the escaped character, whatever it is (\\{, \\}, \\\\)
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last complete top-level \\boxed{...} in `text`, stripped; None if there is none.

    Braces are balanced, so `\\boxed{\\frac{1}{2}}` gives `\\frac{1}{2}`. A box nested in another
    box belongs to the outer one. An unclosed box (a response cut at max_new_tokens) is ignored
    and the last complete box before it, if any, is returned.
    """
    found: str | None = None
    pos = 0
    while True:
        match = _BOXED.search(text, pos)
        if match is None:
            return found
        end = _closing_brace(text, match.end())
        if end is None:
            return found  # everything after an unclosed box is inside it
        found = text[match.end() : end].strip()
        pos = end + 1


def normalise_answer(text: str) -> str:
    """Canonical string form for exact comparison.

    Strips surrounding `$`, unwraps a whole-string \\text{...} (or \\mathrm, \\textbf, \\mathbf),
    removes all whitespace and a trailing period, and case-folds: "$ \\text{Red}. $" -> "red".
    """
    s = text.strip().strip("$").strip()
    wrapper = _TEXT_WRAPPER.match(s)
    if wrapper is not None and _closing_brace(s, wrapper.end()) == len(s) - 1:
        s = s[wrapper.end() : -1]
    s = "".join(s.split()).rstrip(".")
    return s.casefold()


def _gold(answer: str) -> str:
    """The gold answer as a bare expression: datasets sometimes store it already boxed."""
    boxed = last_boxed(answer)
    return boxed if boxed is not None else answer.strip()


class _DropTimeoutWarning(logging.Filter):
    """math-verify warns once that its own timeout is off; the runner enforces one, so it is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


_math_verify: Any = None


def _load_math_verify() -> Any:
    """Import math-verify (and sympy) on first use: the integer fast path never needs it."""
    global _math_verify
    if _math_verify is None:
        import math_verify

        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).addFilter(_DropTimeoutWarning())
        _math_verify = math_verify
    return _math_verify


def math_equal(pred: str, gold: str) -> bool:
    """Whether two bare answers are mathematically equal (math-verify, after cheap exact checks).

    Fast paths, so an integer-answer task never touches sympy: equal normalised strings are
    equal; two integers compare by value. Otherwise both are wrapped in \\boxed{} and compared
    by math_verify.verify (`\\frac{1}{2}` equals `0.5`). math-verify's own signal-based timeouts
    are disabled (they fail outside the main thread); the caller must bound the time, as
    RewardRunner does with worker processes.
    """
    p, g = normalise_answer(pred), normalise_answer(gold)
    if not p or not g:
        return False
    if p == g:
        return True
    if _INTEGER.fullmatch(p) and _INTEGER.fullmatch(g):
        return int(p) == int(g)
    mv = _load_math_verify()
    gold_parsed = mv.parse("\\boxed{" + gold + "}", parsing_timeout=None)
    pred_parsed = mv.parse("\\boxed{" + pred + "}", parsing_timeout=None)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(mv.verify(gold_parsed, pred_parsed, timeout_seconds=None))


@REWARDS.register("accuracy", description="1 if the last \\boxed{} equals the answer (math-verify), else 0")
def accuracy(response: str, answer: str, **context: Any) -> float:
    """1.0 if the last \\boxed{...} of `response` is mathematically equal to `answer`, else 0.0.

    DeepSeek-R1 / DIVA-GRPO rule-based accuracy reward. No box means 0. `answer` may itself be
    boxed. Equality is math_equal: exact/integer fast paths, then math-verify.
    """
    pred = last_boxed(response)
    if pred is None:
        return 0.0
    return 1.0 if math_equal(pred, _gold(answer)) else 0.0


# Called once per reward worker before its first timed call, so the math-verify import is not
# charged to the time limit of the first LaTeX answer.
accuracy.warmup = _load_math_verify  # type: ignore[attr-defined]


@REWARDS.register("format", description="1 if the response is <think>...</think> then a \\boxed{} answer")
def format_reward(response: str, answer: str, **context: Any) -> float:
    """1.0 if `response` is one <think>...</think> block followed by a complete \\boxed{...}, else 0.0.

    The R1-style format reward of DIVA-GRPO (weight 0.1). Rules, chosen to be lenient about
    whitespace and strict about structure:
    - leading and trailing whitespace of the response is ignored;
    - the response must start with `<think>` and contain exactly one `<think>` and one `</think>`;
      the thinking may be empty;
    - after `</think>` there must be a complete, non-empty \\boxed{...}; other text around the box
      ("The answer is \\boxed{3}.") is allowed. A box inside the thinking does not count.
    """
    text = response.strip()
    if not text.startswith("<think>") or text.count("<think>") != 1 or text.count("</think>") != 1:
        return 0.0
    after = text.split("</think>", 1)[1]
    boxed = last_boxed(after)
    return 1.0 if boxed else 0.0


@REWARDS.register("exact_match", description="1 if the last \\boxed{} equals the answer as a normalised string")
def exact_match(response: str, answer: str, **context: Any) -> float:
    """1.0 if the last \\boxed{...} equals `answer` after normalise_answer, else 0.0.

    For string answers (names, colours, choices) where math-verify's symbolic parsing would be
    wrong (it reads "red" as the product r*e*d). No box means 0.
    """
    pred = last_boxed(response)
    if pred is None:
        return 0.0
    gold = normalise_answer(_gold(answer))
    return 1.0 if gold and normalise_answer(pred) == gold else 0.0


__all__ = ["accuracy", "exact_match", "format_reward", "last_boxed", "math_equal", "normalise_answer"]
