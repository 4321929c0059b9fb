"""Quality gates on teacher output: what may become a paraphrase column or a hint-step column.

DIVA-GRPO (arXiv 2603.01106, section "Variants") needs paraphrases that ask the same question
(its "same" variant) and solution steps that make the question easier without giving the
answer away (its "easier" variant, 1..all steps appended as a hint). The gates:
- paraphrase: non-empty, not the original, not a duplicate, exactly as many `<image>` tags as
  the original (the diva selector shows the images where the tags are), and does not reveal
  the answer unless the original already does;
- hint steps: kept only when the teacher's own last \\boxed{} answer was verified equal to the
  gold answer (math-verify, done by the caller in a worker process); steps are cut at the
  first one that reveals the answer, so no kept step contains it.
Each rejection is a short reason code; the runner counts them and logs them per row.
"""

from __future__ import annotations

import re

from grpo_zoo.augment.prompts import IMAGE_TAG
from grpo_zoo.rewards import last_boxed

# Single capital letters that are also English words: "A triangle ..." does not reveal answer "A".
_WORD_LETTERS = ("A", "I")


def gold_text(answer: str) -> str:
    """The gold answer as it would be written in text: unboxed, `$` and whitespace stripped."""
    boxed = last_boxed(answer)
    return (boxed if boxed is not None else answer).strip().strip("$").strip()


def _extends(a: str, b: str) -> bool:
    """Whether characters a and b, side by side, belong to one token (so a match there is not the answer)."""
    return a.isalnum() and b.isalnum()


def reveals_answer(text: str, answer: str) -> bool:
    """Whether `text` gives the answer away: any \\boxed{}, or the gold answer as a standalone token.

    Matching is textual and case-sensitive, ignoring whitespace inside the answer ("x + 1"
    matches "x+1"). A match inside a longer token does not count: answer 3 is not revealed by
    "13", "3.5", "x3" or "3,000"; a sentence-initial "A"/"I" followed by a lowercase word is an article.
    Equal values written differently (1/2 vs 0.5) are not detected.
    """
    if "\\boxed" in text:
        return True
    gold = "".join(gold_text(answer).split())
    if not gold:
        return False
    pattern = r"\s*".join(re.escape(ch) for ch in gold)
    for match in re.finditer(pattern, text):
        start, end = match.start(), match.end()
        before = text[start - 1] if start else ""
        after = text[end] if end < len(text) else ""
        if before and (_extends(before, gold[0]) or _decimal_join(text, start - 1, start - 2, gold[0])):
            continue
        if after and (_extends(gold[-1], after) or _decimal_join(text, end, end + 1, gold[-1])):
            continue
        if gold in _WORD_LETTERS and re.match(r"\s+[a-z]", text[end:]) and _sentence_start(text, start):
            continue
        return True
    return False


def _sentence_start(text: str, pos: int) -> bool:
    """Whether text[pos] starts a sentence (where a capital "A" is the article, not a choice)."""
    head = text[:pos].rstrip()
    return not head or head[-1] in ".!?:\n"


def _decimal_join(text: str, sep: int, away: int, digit: str) -> bool:
    """Whether text[sep] is a '.' or ',' joining the answer's edge digit to the digit at text[away] (3.5, 3,000)."""
    return digit.isdigit() and text[sep] in ".," and 0 <= away < len(text) and text[away].isdigit()


def gate_paraphrases(candidates: list[str] | None, original: str, answer: str,
                     limit: int) -> tuple[list[str], list[str]]:
    """Keep at most `limit` acceptable paraphrases of `original`.

    Args:
        candidates: the teacher's paraphrases, image markers already turned back into `<image>`
            tags; None when its output had no <paraphrase> block at all (malformed).
        original: the dataset's problem text, exactly as stored (its `<image>` tag count is the target).
        answer: the gold answer.
    Returns:
        (kept, reasons): kept paraphrases in the teacher's order; one reason code per rejected one.
    """
    if candidates is None:
        return [], ["paraphrase_malformed"]
    kept: list[str] = []
    reasons: list[str] = []
    tags = original.count(IMAGE_TAG)
    seen = {_fold(original)}
    original_reveals = reveals_answer(original, answer)
    for text in candidates:
        text = text.strip()
        if not text or not text.replace(IMAGE_TAG, "").strip():
            reasons.append("paraphrase_empty")
        elif text.count(IMAGE_TAG) != tags:
            reasons.append("paraphrase_image_tags")
        elif _fold(text) in seen:
            reasons.append("paraphrase_duplicate")
        elif not original_reveals and reveals_answer(text, answer):
            reasons.append("paraphrase_reveals_answer")
        elif len(kept) < limit:
            kept.append(text)
            seen.add(_fold(text))
    return kept, reasons


def _fold(text: str) -> str:
    return " ".join(text.split()).casefold()


def gate_hints(steps: list[str] | None, predicted: str | None, correct: bool, answer: str,
               min_steps: int = 1) -> tuple[list[str], list[str]]:
    """Hint steps from a teacher solution, or none with the reason.

    Args:
        steps: the parsed numbered steps; None when the output had none (malformed).
        predicted: the teacher's last \\boxed{} content; None when it boxed nothing.
        correct: whether `predicted` was verified equal to `answer` (math-verify).
        min_steps: fewer steps than this left after the cut rejects the hints.
    Returns:
        (steps, reasons): the steps before the first one revealing the answer, or [] with
        one reason code: hint_malformed, hint_no_boxed_answer, hint_wrong_answer,
        hint_reveals_answer (every step up to min_steps does) or hint_too_few_steps.
    """
    if steps is None:
        return [], ["hint_malformed"]
    if predicted is None:
        return [], ["hint_no_boxed_answer"]
    if not correct:
        return [], ["hint_wrong_answer"]
    kept: list[str] = []
    for step in steps:
        if reveals_answer(step, answer):
            break
        kept.append(step)
    if len(kept) < min_steps:
        return [], ["hint_reveals_answer" if len(kept) < len(steps) else "hint_too_few_steps"]
    return kept, []


__all__ = ["gate_hints", "gate_paraphrases", "gold_text", "reveals_answer"]
