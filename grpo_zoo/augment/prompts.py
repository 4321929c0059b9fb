"""Teacher prompts from editable template files, and parsers for what the teacher writes back.

Template syntax (see templates/*.txt):
- `{problem}` (required), `{answer}`, `{num_paraphrases}`, `{image_marker}` are replaced
  literally; any other brace, such as `\\boxed{ANSWER}`, is left alone;
- a line starting with `[if images] ` is kept (without the prefix) only for rows with images.
In the problem text each `<image>` tag is shown as the image marker ("[image]"): a local
vision-language teacher turns a literal `<image>` into pixels, and the teacher must be able
to copy the marker into its paraphrases. The images themselves go before the text.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

IMAGE_TAG = "<image>"
FIELDS = ("problem", "answer", "num_paraphrases", "image_marker")
_IF_IMAGES = "[if images] "
_PARAPHRASE = re.compile(r"<paraphrase>(.*?)</paraphrase>", re.S | re.I)
_THINK_END = re.compile(r"</think>", re.I)
# "Step 3: ...", "**Step 3.** ...", "3. ...", "3) ...": a number followed by a separator and a space.
_STEP = re.compile(r"^\s*(?:[*#>-]+\s*)?(?:step\s*(\d{1,3})\s*[.:)]?|(\d{1,3})[.:)](?=\s))\**\s*(.*)$", re.I)


def load_template(path: str, default_name: str) -> str:
    """The template text at `path`, or the packaged templates/<default_name> when path is "".

    Raises ValueError when the file is missing or has no `{problem}` placeholder.
    """
    if path:
        file = Path(path).expanduser()
        if not file.is_file():
            raise ValueError(f"prompt template '{path}' does not exist; give a text file with a {{problem}} "
                             "placeholder")
        text = file.read_text(encoding="utf-8")
    else:
        text = resources.files("grpo_zoo.augment").joinpath("templates", default_name).read_text(encoding="utf-8")
    if "{problem}" not in text:
        raise ValueError(f"prompt template '{path or default_name}' has no {{problem}} placeholder; add one")
    return text


def render(template: str, *, has_images: bool, **fields: object) -> str:
    """Fill a template: known `{field}`s replaced literally, `[if images] ` lines kept only with images."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise ValueError(f"render: unknown template fields {sorted(unknown)}; known: {FIELDS}")
    lines = []
    for line in template.splitlines():
        if line.startswith(_IF_IMAGES):
            if not has_images:
                continue
            line = line[len(_IF_IMAGES):]
        lines.append(line)
    text = "\n".join(lines).strip() + "\n"
    # Problem last: its own text may contain "{answer}" and must not be substituted into.
    for name in sorted(fields, key=lambda n: n == "problem"):
        text = text.replace("{" + name + "}", str(fields[name]))
    return text


def to_teacher_text(problem: str, marker: str) -> str:
    """The problem as the teacher sees it: each `<image>` tag written as the marker."""
    return problem.replace(IMAGE_TAG, marker)


def from_teacher_text(text: str, marker: str) -> str:
    """Teacher text back in dataset form: markers (any case) become `<image>` tags again."""
    return re.sub(re.escape(marker), IMAGE_TAG, text, flags=re.I)


def step_text(step: str, marker: str) -> str:
    """A hint step in dataset form: image markers and tags become "the image".

    add_hint appends steps to the problem, so a `<image>` tag in a step would ask for an
    image the row does not have.
    """
    return re.sub(re.escape(marker) + "|" + re.escape(IMAGE_TAG), "the image", step, flags=re.I)


def final_part(text: str) -> str:
    """The text after the last `</think>` (reasoning models think first), else all of it."""
    parts = _THINK_END.split(text)
    return parts[-1] if len(parts) > 1 else text


def parse_paraphrases(text: str) -> list[str] | None:
    """The contents of every <paraphrase>...</paraphrase> block, stripped; None if there is none."""
    found = [m.strip() for m in _PARAPHRASE.findall(final_part(text))]
    return found or None


def parse_steps(text: str) -> list[str] | None:
    """Numbered steps ("Step 1: ...", "1. ...") in order; None if the text has no step 1.

    A numbered line starts a new step only when its number is the next one expected, so a
    list inside a step or a line starting with a decimal number stays part of the step.
    Unnumbered lines continue the current step; text before step 1 is ignored, and an
    unnumbered line with a \\boxed{} (the final answer line) ends the steps.
    """
    steps: list[str] = []
    for line in final_part(text).splitlines():
        match = _STEP.match(line)
        number = int(match.group(1) or match.group(2)) if match else None
        if match and number == len(steps) + 1:
            steps.append(match.group(3).strip())
        elif steps and "\\boxed" in line:
            break
        elif steps and line.strip():
            steps[-1] = (steps[-1] + " " + line.strip()).strip()
    steps = [s for s in steps if s]
    return steps or None


__all__ = ["from_teacher_text", "load_template", "parse_paraphrases", "parse_steps", "render", "step_text",
           "to_teacher_text"]
