"""Parsing and gating on hand-written teacher outputs (no model, no server)."""

from __future__ import annotations

import pytest

from grpo_zoo.augment import prompts
from grpo_zoo.augment.gates import gate_hints, gate_paraphrases, reveals_answer


def test_parse_paraphrases_takes_tagged_blocks_after_thinking():
    text = ("<think>maybe <paraphrase>draft</paraphrase></think>\n"
            "<paraphrase> A\nB </paraphrase>x<PARAPHRASE>C</PARAPHRASE>")
    assert prompts.parse_paraphrases(text) == ["A\nB", "C"]
    assert prompts.parse_paraphrases("1. Rewrite one\n2. Rewrite two") is None


def test_parse_steps_forms_and_continuations():
    text = ("Let me solve it.\n**Step 1:** Count the circles:\n there are 3.\nStep 2. Double it: 3.5 is not\n"
            "1. a nested list item\nStep 3) Conclude\n\\boxed{6}\nStep 4: after the answer")
    assert prompts.parse_steps(text) == ["Count the circles: there are 3.",
                                         "Double it: 3.5 is not 1. a nested list item", "Conclude"]
    assert prompts.parse_steps("1. First\n2. Second\n3.5 meters is a continuation") == [
        "First", "Second 3.5 meters is a continuation"]
    assert prompts.parse_steps("The answer is \\boxed{3}") is None
    assert prompts.parse_steps("Step 2: no first step") is None


def test_render_fills_fields_literally_and_conditional_lines():
    template = "Q: {problem}\n[if images] Look at {image_marker}.\nWrite \\boxed{ANSWER} ({num_paraphrases})."
    text = prompts.render(template, has_images=False, problem="x {answer} y", answer="7", num_paraphrases=2,
                          image_marker="[image]")
    assert text == "Q: x {answer} y\nWrite \\boxed{ANSWER} (2).\n"  # the problem's own braces are not filled
    assert "Look at [image]." in prompts.render(template, has_images=True, problem="p", image_marker="[image]")
    with pytest.raises(ValueError, match="unknown template fields"):
        prompts.render(template, has_images=False, problem="p", nope=1)


def test_packaged_templates_load_and_custom_ones_need_a_problem(tmp_path):
    for name in ("paraphrase.txt", "solve.txt"):
        assert "{problem}" in prompts.load_template("", name)
    bad = tmp_path / "t.txt"
    bad.write_text("no placeholder")
    with pytest.raises(ValueError, match="no \\{problem\\} placeholder"):
        prompts.load_template(str(bad), "solve.txt")
    with pytest.raises(ValueError, match="does not exist"):
        prompts.load_template(str(tmp_path / "missing.txt"), "solve.txt")


def test_image_marker_round_trip():
    teacher_text = prompts.to_teacher_text("<image>Count <image> shapes", "[image]")
    assert teacher_text == "[image]Count [image] shapes"
    assert prompts.from_teacher_text("[Image] and [image] and <image>", "[image]") == "<image> and <image> and <image>"
    # a hint step is appended to the problem: it must not add an image tag
    assert prompts.step_text("In [image] and <image>, count.", "[image]") == "In the image and the image, count."


@pytest.mark.parametrize("text, answer, expected", [
    ("2 + 1 = 3", "3", True),
    ("so it is 3.", "3", True),
    ("we get 3, then", "3", True),
    ("there are 13 apples", "3", False),
    ("a 3.5 m rope", "3", False),
    ("about 3,000 people", "3", False),
    ("x3 is a variable", "3", False),
    ("A triangle has three sides", "A", False),
    ("so option A is right", "A", True),
    ("it equals x+1", "x + 1", True),
    ("it is \\frac{1}{2} here", "$\\frac{1}{2}$", True),
    ("it is 0.5", "\\frac{1}{2}", False),  # equal value, different text: not detected (documented)
    ("write \\boxed{4}", "9", True),  # any box gives an answer away
    ("nothing here", "\\boxed{12}", False),
])
def test_reveals_answer(text, answer, expected):
    assert reveals_answer(text, answer) is expected


def test_paraphrase_gate_reasons():
    original = "<image>How many circles are in the picture?"
    candidates = ["<image>Count the circles in the picture.", "Count the circles.",
                  "<image>How many circles are in the picture?", "<image>Count the circles in the  picture.",
                  "<image>", "<image>There are 4 circles; how many?", "<image>What number of circles appear?",
                  "<image>Give the circle count."]
    kept, reasons = gate_paraphrases(candidates, original, "4", limit=2)
    assert kept == ["<image>Count the circles in the picture.", "<image>What number of circles appear?"]
    assert reasons == ["paraphrase_image_tags", "paraphrase_duplicate", "paraphrase_duplicate", "paraphrase_empty",
                       "paraphrase_reveals_answer"]  # the last good one is beyond the limit, not a rejection
    assert gate_paraphrases(None, original, "4", 3) == ([], ["paraphrase_malformed"])
    # an original without tags (images shown first) must give paraphrases without tags
    assert gate_paraphrases(["<image>Count them."], "Count the shapes.", "4", 3) == ([], ["paraphrase_image_tags"])
    # the answer may appear when the original already states it
    assert gate_paraphrases(["Is 4 even?"], "Is the number 4 even?", "4", 3)[0] == ["Is 4 even?"]


def test_hint_gate():
    steps = ["Count the red circles: there are 2.", "Count the blue ones: 3 more.", "So 2 + 3 = 5."]
    assert gate_hints(steps, "5", True, "5") == (steps[:2], [])
    assert gate_hints(steps, "6", False, "5") == ([], ["hint_wrong_answer"])
    assert gate_hints(steps, None, False, "5") == ([], ["hint_no_boxed_answer"])
    assert gate_hints(None, "5", True, "5") == ([], ["hint_malformed"])
    assert gate_hints(["There are 5 in all."], "5", True, "5") == ([], ["hint_reveals_answer"])
    assert gate_hints(["One step."], "5", True, "5", min_steps=2) == ([], ["hint_too_few_steps"])
    assert gate_hints(steps, "5", True, "5", min_steps=3) == ([], ["hint_reveals_answer"])
