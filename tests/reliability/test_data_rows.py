"""Bad dataset rows (issue #7): each kind is skipped with one warning naming the dataset and row,
counted, and the load stops with a clear error past data.max_bad_row_share or, under strict, at
the first. Plus a hypothesis fuzz over row contents: a row is a Question or a BadRow, never a crash.
"""

from __future__ import annotations

import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from grpo_zoo import config as config_module
from grpo_zoo.config import DataConfig
from grpo_zoo.configuration import ConfigError
from grpo_zoo.data import (
    MAX_IMAGE_PIXELS,
    BadRow,
    CorruptRow,
    LoadReport,
    drop_long_prompts,
    fit_to_policy,
    load_questions,
    row_to_question,
    rows_to_questions,
)

LENIENT = DataConfig(max_bad_row_share=1.0)


def good_row(h, i: int = 0) -> dict:
    return {"problem": f"<image>How many? ({i})", "answer": str(i), "images": [h.png_bytes()]}


BAD_ROWS = {
    # name: (row update, the reason counted)
    "corrupt image": ({"images": [b"not an image at all"]}, "corrupt image"),
    "truncated image": ({"images": ["TRUNCATED"]}, "corrupt image"),
    "missing image file": ({"images": ["/no/such/image.png"]}, "missing image"),
    "decompression bomb": ({"images": ["BOMB"]}, "oversized image"),
    "beyond the pixel cap": ({"images": ["BIG"]}, "oversized image"),
    "empty answer": ({"answer": "   "}, "empty answer"),
    "null answer": ({"answer": None}, "empty answer"),
    "list answer": ({"answer": ["1"]}, "bad answer"),
    "nan answer": ({"answer": float("nan")}, "bad answer"),
    "bool answer": ({"answer": True}, "bad answer"),
    "empty problem": ({"problem": ""}, "empty problem"),
    "non-string problem": ({"problem": 7}, "empty problem"),
    "tag without image": ({"problem": "<image><image>two?"}, "image count mismatch"),
    "unsupported image value": ({"images": [12]}, "unreadable image"),
}


def materialise(h, update: dict) -> dict:
    images = update.get("images")
    if images and isinstance(images[0], str) and images[0] in ("TRUNCATED", "BOMB", "BIG"):
        side = int(MAX_IMAGE_PIXELS**0.5) + 1
        update = {
            **update,
            "images": [{"TRUNCATED": h.png_bytes()[:45], "BOMB": h.bomb_png(60000, 60000),
                        "BIG": h.bomb_png(side, side)}[images[0]]],
        }
    return update


@pytest.mark.parametrize("name", list(BAD_ROWS))
def test_each_bad_row_is_skipped_with_one_warning_and_counted(h, caplog, name):
    update, reason = BAD_ROWS[name]
    rows = [good_row(h, 0), {**good_row(h, 1), **materialise(h, update)}, good_row(h, 2)]
    with caplog.at_level(logging.WARNING, logger="grpo_zoo.data"):
        questions, report = rows_to_questions(rows, LENIENT, "my.jsonl")
    assert [q.answer for q in questions] == ["0", "2"]
    assert [q.question_id for q in questions] == [0, 1]  # renumbered: ids index the pool
    assert report.skipped == 1 and report.reasons == {reason: 1} and report.kept_rows == [0, 2]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "'my.jsonl' row 1" in warnings[0] and reason in warnings[0]


def test_numbers_are_answers(h):
    assert row_to_question({"problem": "p", "answer": 3}, 0, LENIENT).answer == "3"
    assert row_to_question({"problem": "p", "answer": 3.0}, 0, LENIENT).answer == "3"  # int column with nulls
    assert row_to_question({"problem": "p", "answer": 0.5}, 0, LENIENT).answer == "0.5"


def test_share_of_bad_rows_stops_the_load(h):
    rows = [good_row(h, 0), {**good_row(h, 1), "answer": ""}, good_row(h, 2), good_row(h, 3)]
    with pytest.raises(ConfigError, match=r"1 of 4 rows are bad .*data.max_bad_row_share = 0.2"):
        rows_to_questions(rows, DataConfig(max_bad_row_share=0.2), "d")
    assert rows_to_questions(rows, DataConfig(max_bad_row_share=0.25), "d")[1].skipped == 1
    with pytest.raises(ConfigError, match="no usable rows"):
        rows_to_questions([{"problem": "p", "answer": ""}], LENIENT, "d")


def test_strict_stops_at_the_first_bad_row(h):
    rows = [good_row(h, 0), good_row(h, 1), {**good_row(h, 2), "images": [b"junk"]}, {**good_row(h, 3), "answer": ""}]
    with pytest.raises(ConfigError, match=r"'d' row 2: corrupt image.*strict"):
        rows_to_questions(rows, DataConfig(strict=True, max_bad_row_share=1.0), "d")


def test_missing_columns_say_which_key_to_set(h):
    with pytest.raises(ConfigError, match=r"no column 'answer'.*set data.answer_key"):
        rows_to_questions([{"problem": "p", "solution": "1"}], LENIENT, "d")
    with pytest.raises(ConfigError, match=r"no column 'problem'.*set data.problem_key"):
        rows_to_questions([{"question": "p", "answer": "1"}], LENIENT, "d")
    with pytest.raises(ConfigError, match=r"<image> tags but there is no column 'images'.*data.image_key"):
        rows_to_questions([{"problem": "<image>p", "answer": "1", "pics": []}], LENIENT, "d")


def test_jsonl_file_with_bad_rows_and_relative_image_paths(h, tmp_path):
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "ok.png").write_bytes(h.png_bytes())
    (tmp_path / "img" / "bad.png").write_bytes(b"\x89PNG but not really")
    (tmp_path / "img" / "bomb.png").write_bytes(h.bomb_png(50000, 50000))
    rows = [{"problem": "<image>q", "answer": "1", "images": ["img/ok.png"]} for _ in range(7)]
    rows += [
        {"problem": "<image>q", "answer": "1", "images": ["img/bad.png"]},
        {"problem": "<image>q", "answer": "1", "images": ["img/bomb.png"]},
        {"problem": "<image>q", "answer": "1", "images": ["img/gone.png"]},
    ]
    path = h.write_jsonl(tmp_path / "train.jsonl", rows)
    with path.open("a") as f:
        f.write('{"problem": "<image>q", "answer": \n\n["not", "an", "object"]\n')  # broken lines, a blank one
    data = DataConfig(max_bad_row_share=0.5)
    questions, report = load_questions(str(path), data, config_module.TestbedConfig(), "train")
    assert len(questions) == 7 and questions[0].images[0].size == (8, 8)
    assert report.reasons == {"corrupt image": 1, "oversized image": 1, "missing image": 1, "corrupt row": 2}
    assert report.rows == 12 and report.metrics("train")["data/train_skipped"] == 5.0
    assert report.metrics("train")["data/train_skipped_oversized_image"] == 1.0


def test_parquet_with_image_features_never_lets_datasets_decode(h, tmp_path):
    # datasets decodes Image features itself and raised on the first corrupt one, aborting the load.
    import datasets

    good, bad = {"bytes": h.png_bytes(), "path": None}, {"bytes": b"junk", "path": None}
    features = datasets.Features(
        {"problem": datasets.Value("string"), "answer": datasets.Value("string"),
         "images": datasets.Sequence(datasets.Image())}
    )
    data = {"problem": ["<image>a", "<image>b", "<image>c"], "answer": ["1", "2", "3"],
            "images": [[good], [bad], [good]]}
    datasets.Dataset.from_dict(data, features=features).to_parquet(str(tmp_path / "train.parquet"))
    questions, report = load_questions(str(tmp_path / "train.parquet"), LENIENT, config_module.TestbedConfig(), "train")
    assert [q.answer for q in questions] == ["1", "3"] and report.reasons == {"corrupt image": 1}


def fake_lengths(lengths: dict[str, int]):
    return lambda q: lengths[q.answer]


def test_long_prompts_are_skipped_counted_and_renumbered(h, caplog):
    rows = [{"problem": "p", "answer": str(i)} for i in range(5)]
    rows.insert(1, {"problem": "p", "answer": ""})  # a load-time skip: row 1
    lengths = fake_lengths({"0": 5, "1": 11, "2": 10, "3": 99, "4": 1})  # limit 10: "1" (row 2), "3" (row 4)

    def drop(**data):
        questions, report = rows_to_questions(rows, LENIENT, "d")
        return drop_long_prompts(questions, lengths, DataConfig(max_prompt_length=10, **data), report)

    with caplog.at_level(logging.WARNING, logger="grpo_zoo.data"):
        kept, report = drop(max_bad_row_share=0.5)
    assert [q.answer for q in kept] == ["0", "2", "4"] and [q.question_id for q in kept] == [0, 1, 2]
    assert report.reasons == {"empty answer": 1, "prompt too long": 2} and report.skipped == 3
    assert report.kept_rows == [0, 3, 5]
    assert "'d' row 2: prompt too long: 11 tokens > data.max_prompt_length = 10" in caplog.text  # the dataset row
    with pytest.raises(ConfigError, match="3 of 6 rows are bad"):  # load and length skips share one budget
        drop(max_bad_row_share=0.4)
    with pytest.raises(ConfigError, match="row 2: prompt too long"):
        drop(strict=True)


def test_prompt_length_is_measured_with_the_policy(h, tiny_model):
    from grpo_zoo.policy import Policy

    policy = Policy.from_pretrained(str(tiny_model))
    rows = [{"problem": "<image>short", "answer": "1", "images": [h.png_bytes()]},
            {"problem": "<image>" + "long " * 40, "answer": "2", "images": [h.png_bytes()]}]
    questions, report = rows_to_questions(rows, LENIENT, "d")
    data = DataConfig(max_prompt_length=60, max_bad_row_share=0.5)
    kept, report = fit_to_policy(questions, report, policy, data)
    assert [q.answer for q in kept] == ["1"] and report.reasons == {"prompt too long": 1}
    testbed = LoadReport("testbed", 2, 0)
    assert fit_to_policy(questions, testbed, policy, data)[0] is questions  # generated prompts: not measured


# ---- fuzz ----------------------------------------------------------------------------------------

IMAGE_VALUES = st.one_of(
    st.none(),
    st.binary(max_size=64),
    st.sampled_from(["GOOD", "BOMB", "/no/such.png", "", "GOODDICT", "PATHDICT"]),
    st.integers(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(
        st.sampled_from(["bytes", "path"]), st.one_of(st.none(), st.binary(max_size=8), st.text(max_size=4)), max_size=2
    ),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=False),
    st.text(max_size=12),
    st.lists(st.text(max_size=3), max_size=2),
)
ROWS = st.fixed_dictionaries(
    {},
    optional={
        "problem": st.one_of(SCALARS, st.sampled_from(["<image>q", "<image><image>q", "q"])),
        "answer": SCALARS,
        "images": st.one_of(IMAGE_VALUES, st.lists(IMAGE_VALUES, max_size=3)),
        "paraphrases": SCALARS,
        "hint_steps": SCALARS,
    },
)


def concrete_images(h, value):
    table = {"GOOD": h.png_bytes(), "BOMB": h.bomb_png(40000, 40000), "GOODDICT": {"bytes": h.png_bytes()},
             "PATHDICT": {"path": "/no/such.png", "bytes": None}}
    if isinstance(value, list):
        return [concrete_images(h, v) for v in value]
    return table.get(value, value) if isinstance(value, str) else value


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(row=ROWS)
def test_fuzz_a_row_is_a_question_or_a_bad_row(h, row):
    if "images" in row:
        row = {**row, "images": concrete_images(h, row["images"])}
    try:
        q = row_to_question(row, 0, LENIENT)
    except BadRow as exc:
        assert ":" in str(exc)  # "reason: detail"
        return
    assert isinstance(q.problem, str) and q.problem.strip()
    assert isinstance(q.answer, str) and q.answer and q.answer == q.answer.strip()
    assert all(isinstance(im, Image.Image) and im.mode == "RGB" for im in q.images)
    assert all(im.width * im.height <= MAX_IMAGE_PIXELS for im in q.images)
    assert q.problem.count("<image>") == len(q.images)
    assert all(isinstance(p, str) for p in q.paraphrases + q.hint_steps)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(ROWS, min_size=1, max_size=6), share=st.sampled_from([0.0, 0.5, 1.0]))
def test_fuzz_a_dataset_loads_or_says_why(h, rows, share):
    rows = [{"problem": "p", "answer": "a", **r} for r in rows]  # the columns exist; their values are fuzzed
    if len(rows) > 2:
        rows.insert(len(rows) // 2, CorruptRow("x.jsonl line 3 is not JSON"))
    rows = [{**r, "images": concrete_images(h, r["images"])} if "images" in r else r for r in rows]
    try:
        questions, report = rows_to_questions(rows, DataConfig(max_bad_row_share=share), "fuzz")
    except ConfigError as exc:
        assert "max_bad_row_share" in str(exc) or "no usable rows" in str(exc) or "data.image_key" in str(exc)
        return
    assert len(questions) + report.skipped == len(rows) == report.rows
    assert report.skipped <= share * len(rows)
    assert [q.question_id for q in questions] == list(range(len(questions)))
