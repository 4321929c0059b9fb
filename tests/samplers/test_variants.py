"""grpo_zoo.variants: what each perturbation really does to an image, and the text helpers."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from grpo_zoo.variants import (
    ONLY_VISION_PROMPT,
    TRANSFORMS,
    add_hint,
    perturb_image,
    render_only_vision,
    rotation_note,
)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def solid(rgb, size=(112, 112)) -> Image.Image:
    return Image.new("RGB", size, rgb)


def arr(image: Image.Image) -> np.ndarray:
    return np.asarray(image, dtype=np.float64)


def checkerboard(size: int = 64) -> Image.Image:
    y, x = np.mgrid[0:size, 0:size]
    board = (((x // 2) + (y // 2)) % 2 * 255).astype(np.uint8)
    return Image.fromarray(np.stack([board] * 3, axis=-1))


def roughness(image: Image.Image) -> float:
    """Mean absolute difference between horizontal neighbours: high-frequency content."""
    a = arr(image)
    return float(np.abs(np.diff(a, axis=1)).mean())


# ---------------------------------------------------------------------------------------
# Text helpers
# ---------------------------------------------------------------------------------------


def test_add_hint_appends_the_first_k_steps_and_asks_for_full_reasoning():
    steps = ["Count the red shapes: 3.", "Add 2.", "Answer 5."]
    out = add_hint("<image>How many?", steps, 2)
    assert out.startswith("<image>How many?\nHint: Count the red shapes: 3. Add 2.")
    assert "Answer 5." not in out and "all steps" in out
    assert len(out) - len("<image>How many?") < 70  # short: the testbed tokenizer is per character
    assert add_hint("Q", steps, 10).count("Answer 5.") == 1  # k beyond the list = all steps


def test_add_hint_rejects_empty_steps_and_bad_k():
    with pytest.raises(ValueError, match="hint_steps"):
        add_hint("Q", [], 1)
    with pytest.raises(ValueError, match="k must be >= 1"):
        add_hint("Q", ["a"], 0)


def test_rotation_note_states_the_angle():
    assert rotation_note("Q", 37.0).endswith("rotated 37 degrees counterclockwise.")
    assert rotation_note("Q", -42.5).startswith("Q\n") and "-42.5 degrees" in rotation_note("Q", -42.5)


# ---------------------------------------------------------------------------------------
# Perturbations
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("sigma", [0.30, 0.45])
def test_noise_std_matches_sigma(sigma):
    # On a mid-grey image the pixel noise is N(0, sigma) clipped to [0, 1]; compare the measured
    # std with the clipped normal's (sampled separately), and the unclipped part with sigma.
    out, info = perturb_image(solid((128, 128, 128), (200, 200)), ["noise"], sigma, rng(1))
    x = arr(out) / 255.0
    ref = np.clip(128 / 255 + np.random.default_rng(99).normal(0, sigma, 2_000_000), 0, 1)
    assert x.std() == pytest.approx(ref.std(), rel=0.02)
    inside = x[(x > 0) & (x < 1)] - 128 / 255
    assert info["noise_sigma"] == sigma
    assert abs(inside.mean()) < 0.01
    # Without clipping (a small sigma keeps every pixel inside [0, 1]) the std is sigma itself.
    small, _ = perturb_image(solid((128, 128, 128), (200, 200)), ["noise"], 0.05, rng(2))
    assert (arr(small) / 255.0).std() == pytest.approx(0.05, rel=0.03)


@pytest.mark.parametrize("name", TRANSFORMS)
def test_channels_are_not_swapped(name):
    # A red image stays red and a green one green: no RGB/BGR mix-up in any path.
    for rgb, channel in (((230, 20, 10), 0), ((10, 220, 30), 1)):
        out, _ = perturb_image(solid(rgb), [name], 0.30, rng(3))
        means = arr(out).reshape(-1, 3).mean(axis=0)
        assert out.mode == "RGB" and out.size == (112, 112)
        assert int(np.argmax(means)) == channel, (name, means)
        assert means[2] < means[channel] - 80


def test_rotation_really_rotates_by_the_reported_angle():
    # A bright dot 30 px right of the centre must land at angle theta counterclockwise (image y points down).
    base = np.zeros((121, 121, 3), dtype=np.uint8)
    base[58:63, 88:93] = 255  # centre (60, 90): offset +30 in x
    out, info = perturb_image(Image.fromarray(base), ["rotate"], 0.30, rng(5))
    theta = np.deg2rad(info["angle"])
    assert 30 <= abs(info["angle"]) <= 60 and float(info["angle"]).is_integer()
    a = arr(out)[..., 0]
    ys, xs = np.nonzero(a > 100)
    expected = (60 + 30 * np.cos(theta), 60 - 30 * np.sin(theta))
    assert np.hypot(xs.mean() - expected[0], ys.mean() - expected[1]) < 1.5
    assert np.hypot(xs.mean() - 90, ys.mean() - 60) > 10  # it moved


def test_salt_and_pepper_covers_the_whole_image_without_binarising():
    image = solid((120, 80, 40), (150, 150))
    out, info = perturb_image(image, ["salt_pepper"], 0.30, rng(6))
    a, b = arr(out), arr(image)
    changed = np.any(a != b, axis=-1)
    assert changed.mean() == pytest.approx(info["salt_pepper_amount"], abs=0.01)
    assert info["salt_pepper_amount"] == pytest.approx(0.10)
    values = a[changed]
    assert np.all((values == 0).all(axis=-1) | (values == 255).all(axis=-1))  # pure black or white
    np.testing.assert_array_equal(a[~changed], b[~changed])  # every other pixel keeps its colour
    for third in np.array_split(changed, 3, axis=0):  # not only the top third
        assert third.mean() > 0.07


def test_blur_smooths_and_keeps_the_mean():
    board = checkerboard()
    out, info = perturb_image(board, ["blur"], 0.30, rng(0))
    assert info["blur_radius"] > 0.5
    assert roughness(out) < 0.3 * roughness(board)
    assert arr(out).mean() == pytest.approx(arr(board).mean(), rel=0.05)


def test_low_resolution_keeps_the_size_and_loses_detail():
    board = checkerboard()
    out, info = perturb_image(board, ["low_res"], 0.45, rng(0))
    assert out.size == board.size and info["low_res_factor"] == pytest.approx(3.7)
    assert roughness(out) < 0.3 * roughness(board)


def test_occlusion_is_one_grey_rectangle_of_the_right_area():
    image = solid((250, 10, 10), (100, 80))
    out, info = perturb_image(image, ["occlude"], 0.30, rng(8))
    changed = np.any(arr(out) != arr(image), axis=-1)
    x0, y0, x1, y1 = info["occlude_box"]
    assert changed.sum() == (x1 - x0) * (y1 - y0) == changed[y0:y1, x0:x1].size
    assert changed.mean() == pytest.approx(0.15, abs=0.02)
    assert (arr(out)[y0:y1, x0:x1] == 127).all()


def test_combinations_apply_each_transform_and_report_it():
    out, info = perturb_image(checkerboard(), ["rotate", "noise", "occlude"], 0.45, rng(9))
    assert info["transforms"] == ["rotate", "noise", "occlude"] and info["strength"] == 0.45
    assert {"angle", "noise_sigma", "occlude_box"} <= set(info)


def test_deterministic_per_seed():
    image = checkerboard()
    a, ia = perturb_image(image, list(TRANSFORMS), 0.30, rng(11))
    b, ib = perturb_image(image, list(TRANSFORMS), 0.30, rng(11))
    c, _ = perturb_image(image, list(TRANSFORMS), 0.30, rng(12))
    assert a.tobytes() == b.tobytes() and ia == ib
    assert a.tobytes() != c.tobytes()


@pytest.mark.parametrize("size", [(1, 1), (3, 7), (300, 180)])
def test_any_size_and_mode(size):
    for mode in ("RGB", "L", "RGBA"):
        image = Image.new(mode, size)
        out, _ = perturb_image(image, list(TRANSFORMS), 0.45, rng(0))
        assert out.size == size and out.mode == "RGB"


def test_bad_transform_or_strength_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown transform"):
        perturb_image(solid((0, 0, 0)), ["swirl"], 0.3, rng())
    with pytest.raises(ValueError, match="strength"):
        perturb_image(solid((0, 0, 0)), ["noise"], 0.0, rng())


def test_input_image_is_left_unchanged():
    image = checkerboard()
    before = image.tobytes()
    perturb_image(image, list(TRANSFORMS), 0.45, rng())
    assert image.tobytes() == before


# ---------------------------------------------------------------------------------------
# Only-vision
# ---------------------------------------------------------------------------------------


def test_only_vision_renders_text_into_an_image_of_the_given_size():
    picture = solid((40, 120, 220))
    out, text = render_only_vision("<image>How many circles are there in the picture?", picture, (112, 112))
    assert out.size == (112, 112) and out.mode == "RGB"
    assert text == ONLY_VISION_PROMPT and text.count("<image>") == 1 and "circles" not in text
    a = arr(out)
    blue = (a[..., 2] > 150) & (a[..., 0] < 100)
    dark = a.sum(axis=-1) < 250  # text ink
    assert blue.mean() > 0.1  # the original picture is still there
    assert dark[blue.any(axis=1).nonzero()[0].max() + 1 :].sum() > 20  # ink below the picture


def test_only_vision_without_an_image_and_text_differences():
    a, _ = render_only_vision("What is 2 + 3?", None, (96, 64))
    b, _ = render_only_vision("What is 7 + 8?", None, (96, 64))
    assert a.size == (96, 64) and (arr(a) < 128).any()
    assert a.tobytes() != b.tobytes()
    with pytest.raises(ValueError, match="size"):
        render_only_vision("Q", None, (0, 10))
