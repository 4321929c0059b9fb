"""DIVA variant material: hints, rotation notes, image perturbations, only-vision rendering.

DIVA-GRPO (arXiv 2603.01106) makes a question harder or easier without changing its answer:
- harder: perturb the image (rotation by a real angle, stated in the prompt; Gaussian noise
  with sigma 0.30-0.45 on [0, 1] pixels; salt-and-pepper; blur; low resolution; occlusion;
  several at once), or render the question text into the image ("only-vision");
- easier: append the first k reasoning steps as a hint.
Everything here is deterministic given the numpy Generator passed in, works on any image
size, keeps RGB channel order (no BGR round trip, one of the authors' bugs), and never
binarises an image (salt-and-pepper changes only the chosen pixels, over the whole image).
Text additions are short because the testbed tokenizer is character-level.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

TRANSFORMS: tuple[str, ...] = ("rotate", "noise", "salt_pepper", "blur", "low_res", "occlude")
"""Image perturbation names accepted by `perturb_image`, in the order they are applied by DIVA."""

NOISE_SIGMA_RANGE: tuple[float, float] = (0.30, 0.45)
"""The paper's Gaussian noise levels (std on [0, 1] pixels); `strength` is sigma itself."""

ONLY_VISION_PROMPT = "<image>\nSolve the problem shown in the image."
"""The text prompt of an only-vision variant: a pointer to the image, keeping the <image> tag."""

OCCLUDER_RGB = (127, 127, 127)


def add_hint(problem: str, steps: list[str], k: int) -> str:
    """Append the first k reasoning steps as a hint (DIVA's "easier" variant).

    k larger than len(steps) gives all steps. The suffix asks for the full reasoning anyway, so
    the model does not learn to copy the hint and stop.
    """
    if not steps:
        raise ValueError("add_hint: steps is empty; the question has no hint_steps to show")
    if k < 1:
        raise ValueError(f"add_hint: k must be >= 1 (number of steps to reveal), got {k}")
    shown = " ".join(s.strip() for s in steps[:k] if s.strip())
    return f"{problem}\nHint: {shown}\nShow all steps."


def rotation_note(problem: str, angle: float) -> str:
    """The line a rotated-image variant adds: the angle is real and counterclockwise (PIL's sense)."""
    return f"{problem}\nNote: the image is rotated {angle:g} degrees counterclockwise."


# ---------------------------------------------------------------------------------------
# Image perturbations. Each takes an RGB uint8 array [H, W, 3] and returns a new one.
# ---------------------------------------------------------------------------------------


def _to_float(arr: np.ndarray) -> np.ndarray:
    return arr.astype(np.float64) / 255.0


def _to_uint8(x: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(x * 255.0), 0, 255).astype(np.uint8)


def _border_colour(arr: np.ndarray) -> tuple[int, int, int]:
    edge = np.concatenate([arr[0], arr[-1], arr[:, 0], arr[:, -1]])  # [P, 3]
    return tuple(int(v) for v in np.rint(edge.mean(axis=0)))


def _rotate(arr: np.ndarray, strength: float, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, Any]]:
    # A whole-degree angle in [100, 200] * strength (30-60 deg at 0.30, 45-90 at 0.45), random sign,
    # so the prompt can state it exactly. Corners are filled with the border colour.
    magnitude = int(rng.integers(int(round(100 * strength)), int(round(200 * strength)) + 1))
    angle = float(max(magnitude, 1) * (1 if rng.random() < 0.5 else -1))
    img = Image.fromarray(arr).rotate(angle, resample=Image.Resampling.BICUBIC, fillcolor=_border_colour(arr))
    return np.asarray(img), {"angle": angle}


def _noise(arr: np.ndarray, strength: float, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, Any]]:
    noisy = _to_float(arr) + rng.normal(0.0, strength, size=arr.shape)
    return _to_uint8(noisy), {"noise_sigma": strength}


def _salt_pepper(arr: np.ndarray, strength: float, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, Any]]:
    # strength / 3 of all pixels (10% at 0.30), anywhere in the image, half white half black;
    # every other pixel keeps its value.
    amount = strength / 3.0
    h, w = arr.shape[:2]
    hit = rng.random((h, w)) < amount
    salt = rng.random((h, w)) < 0.5
    out = arr.copy()
    out[hit & salt] = 255
    out[hit & ~salt] = 0
    return out, {"salt_pepper_amount": amount}


def _blur(arr: np.ndarray, strength: float, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, Any]]:
    radius = max(0.5, strength * min(arr.shape[:2]) / 25.0)  # 1.3 px at 0.30 on 112 px, scales with size
    img = Image.fromarray(arr).filter(ImageFilter.GaussianBlur(radius))
    return np.asarray(img), {"blur_radius": radius}


def _low_res(arr: np.ndarray, strength: float, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, Any]]:
    factor = 1.0 + 6.0 * strength  # 2.8x smaller at 0.30, 3.7x at 0.45, then back up to the original size
    h, w = arr.shape[:2]
    small = (max(1, int(round(w / factor))), max(1, int(round(h / factor))))
    img = Image.fromarray(arr).resize(small, Image.Resampling.BOX).resize((w, h), Image.Resampling.BILINEAR)
    return np.asarray(img), {"low_res_factor": factor}


def _occlude(arr: np.ndarray, strength: float, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, Any]]:
    # One grey rectangle covering strength / 2 of the image (15% at 0.30), aspect ratio 1:2 to 2:1.
    h, w = arr.shape[:2]
    area = strength / 2.0 * h * w
    aspect = float(np.exp(rng.uniform(np.log(0.5), np.log(2.0))))
    bw = int(np.clip(round(np.sqrt(area * aspect)), 1, w))
    bh = int(np.clip(round(area / bw), 1, h))
    x0 = int(rng.integers(0, w - bw + 1))
    y0 = int(rng.integers(0, h - bh + 1))
    out = arr.copy()
    out[y0 : y0 + bh, x0 : x0 + bw] = OCCLUDER_RGB
    return out, {"occlude_box": [x0, y0, x0 + bw, y0 + bh]}


_APPLY: dict[str, Callable[[np.ndarray, float, np.random.Generator], tuple[np.ndarray, dict[str, Any]]]] = {
    "rotate": _rotate,
    "noise": _noise,
    "salt_pepper": _salt_pepper,
    "blur": _blur,
    "low_res": _low_res,
    "occlude": _occlude,
}


def perturb_image(
    image: Image.Image, transforms: list[str], strength: float, rng: np.random.Generator
) -> tuple[Image.Image, dict[str, Any]]:
    """Apply `transforms` in the given order at `strength` (DIVA's "harder" image variants).

    strength is in (0, 1]; the paper uses 0.30 and 0.45 and it is the noise sigma on [0, 1]
    pixels. Returns a new RGB image of the same size and an info dict with "transforms",
    "strength" and each transform's parameters ("angle" in degrees counterclockwise for
    rotate; state it in the prompt with `rotation_note`). Non-RGB inputs are converted to RGB.
    """
    unknown = [t for t in transforms if t not in _APPLY]
    if unknown:
        raise ValueError(f"perturb_image: unknown transform(s) {unknown}; known: {', '.join(TRANSFORMS)}")
    if not 0.0 < strength <= 1.0:
        raise ValueError(f"perturb_image: strength must be in (0, 1] (noise sigma on [0,1] pixels), got {strength}")
    arr = np.asarray(image.convert("RGB"), dtype=np.uint8).copy()  # [H, W, 3]
    info: dict[str, Any] = {"transforms": list(transforms), "strength": float(strength)}
    for name in transforms:
        arr, details = _APPLY[name](arr, strength, rng)
        info.update(details)
    return Image.fromarray(np.ascontiguousarray(arr)), info


# ---------------------------------------------------------------------------------------
# Only-vision: the question text moves into the image.
# ---------------------------------------------------------------------------------------


def _wrap(text: str, font: Any, width_px: int) -> list[str]:
    draw = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    char_w = max(1.0, draw.textlength("x" * 10, font=font) / 10.0)
    lines: list[str] = []
    for paragraph in text.splitlines() or [""]:
        lines += textwrap.wrap(paragraph, width=max(8, int(width_px / char_w))) or [""]
    return lines


def _text_block(lines: list[str], font: Any, width: int, line_h: int) -> Image.Image:
    block = Image.new("RGB", (width, line_h * len(lines) + 4), (255, 255, 255))
    draw = ImageDraw.Draw(block)
    for i, line in enumerate(lines):
        draw.text((2, 2 + i * line_h), line, fill=(0, 0, 0), font=font)
    return block


def _fit(image: Image.Image, width: int, height: int) -> Image.Image:
    """`image` scaled (aspect kept) into width x height, centred on white."""
    scale = min(width / image.width, height / image.height)
    fitted = image.resize(
        (max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.Resampling.LANCZOS
    )
    out = Image.new("RGB", (width, height), (255, 255, 255))
    out.paste(fitted, ((width - fitted.width) // 2, (height - fitted.height) // 2))
    return out


def render_only_vision(problem: str, image: Image.Image | None, size: tuple[int, int]) -> tuple[Image.Image, str]:
    """Render the question text under the image (PIL's default font) and point the prompt at it.

    The result is exactly `size` = (width, height), white background. The text is wrapped at
    the target width in the font's own size, so it stays legible, and the picture is scaled
    into the space above it; when the text would need more than 70% of the height, the whole
    composition is laid out wider and scaled down instead. `<image>` tags are dropped from the
    rendered text; with no image the text alone is rendered. Returns (image, ONLY_VISION_PROMPT).
    """
    width, height = int(size[0]), int(size[1])
    if width < 1 or height < 1:
        raise ValueError(f"render_only_vision: size must be positive (width, height), got {size}")
    text = re.sub(r"[ \t]+", " ", problem.replace("<image>", " ")).strip()
    font = ImageFont.load_default()
    box = font.getbbox("Ag")
    line_h = int(box[3] - min(box[1], 0)) + 2
    top = image.convert("RGB") if image is not None else None
    lines = _wrap(text, font, width - 4)
    block = _text_block(lines, font, width, line_h)
    if top is None and block.height <= height:
        return _fit(block, width, height), ONLY_VISION_PROMPT
    if top is not None and block.height <= 0.7 * height:
        out = Image.new("RGB", (width, height), (255, 255, 255))
        out.paste(_fit(top, width, height - block.height), (0, 0))
        out.paste(block, (0, height - block.height))
        return out, ONLY_VISION_PROMPT
    # Too much text for the canvas: lay it out at a wider natural size and scale everything down.
    canvas_w = max(top.width if top is not None else 0, 2 * width, 200)
    block = _text_block(_wrap(text, font, canvas_w - 4), font, canvas_w, line_h)
    top_h = top.height if top is not None else 0
    canvas = Image.new("RGB", (canvas_w, top_h + block.height), (255, 255, 255))
    if top is not None:
        canvas.paste(top, ((canvas_w - top.width) // 2, 0))
    canvas.paste(block, (0, top_h))
    return _fit(canvas, width, height), ONLY_VISION_PROMPT


__all__ = [
    "NOISE_SIGMA_RANGE",
    "ONLY_VISION_PROMPT",
    "TRANSFORMS",
    "add_hint",
    "perturb_image",
    "render_only_vision",
    "rotation_note",
]
