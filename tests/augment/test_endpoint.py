"""The endpoint teacher end to end against a local chat-completions server: faults, gates, resume, CLI."""

from __future__ import annotations

import json

import pytest

from grpo_zoo.augment import AugmentConfig, TeacherConfig, augment
from grpo_zoo.augment.files import journal_path
from grpo_zoo.augment.teachers import EndpointTeacher, TeacherRequest, chat_url
from grpo_zoo.cli import main
from grpo_zoo.config import DataConfig
from grpo_zoo.config import TestbedConfig as BedConfig  # "Test*" names confuse pytest collection
from grpo_zoo.data import load_questions


def _teacher(url: str, **kw) -> TeacherConfig:
    opts = dict(source=url, timeout_s=0.3, max_retries=1, backoff_s=0.001, workers=4)
    opts.update(kw)
    return TeacherConfig(**opts)


def _cfg(inp, out, url, **kw) -> AugmentConfig:
    return AugmentConfig(input=str(inp), output=str(out), teacher=_teacher(url), verify_workers=0, progress=False,
                         **kw)


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_endpoint_augments_gates_and_keeps_every_row(chat_server, jsonl_dataset, tmp_path):
    out = tmp_path / "out" / "train_aug.jsonl"
    report = augment(_cfg(jsonl_dataset, out, chat_server.url))
    rows = _rows(out)
    assert len(rows) == 7 and [r["answer"] for r in rows] == ["5", "8", "7", "4", "6", "6", "18"]
    assert rows[0]["subject"] == "add" and rows[0]["images"] == _rows(jsonl_dataset)[0]["images"]  # untouched
    assert all(r["difficulty"] == 5.0 for r in rows)
    # Image row: the paraphrase that dropped the image tag is rejected; the answer step is cut.
    assert rows[0]["paraphrases"] == ["<image>Compute 2 plus 3.", "<image>Find the sum of 2 and 3."]
    assert rows[0]["hint_steps"] == ["Take 2.", "Add 3 to it."]
    assert len(rows[1]["paraphrases"]) == 3 and rows[1]["hint_steps"] == ["Take 4.", "Add 4 to it."]
    assert rows[2]["hint_steps"] == ["Take 1.", "Add 6 to it."]  # FLAKY: a 500, then a retry succeeded
    assert chat_server.hits["solve:FLAKY What is 1 + 6?"] == 2
    assert rows[3]["paraphrases"] == [] and rows[3]["hint_steps"] == []  # SLOW: timed out twice, left as is
    assert chat_server.hits["solve:SLOW What is 2 + 2?"] == 2
    assert rows[4]["paraphrases"] == [] and rows[4]["hint_steps"] == []  # GARBAGE: malformed, rejected
    assert rows[5]["hint_steps"] == [] and rows[5]["paraphrases"]  # WRONG answer: no hints, paraphrases fine
    assert rows[6]["paraphrases"] == ["Sum 9 and 9."]  # already augmented: skipped, kept
    assert report.rows == 7 and report.skipped == 1 and report.attempted == 6 and report.failed == 1
    assert report.augmented == 4 and report.rejected_rows == 2
    assert report.rejections == {"paraphrase_image_tags": 1, "paraphrase_malformed": 1, "hint_malformed": 1,
                                 "hint_wrong_answer": 1}
    assert report.with_paraphrases == 5 and report.with_hints == 4
    # The image went to the vision teacher, as a data URL before the text, with the marker in the text.
    image_requests = [r for r in chat_server.requests if not isinstance(r["messages"][-1]["content"], str)]
    assert len(image_requests) == 2 and all(r["model"] == chat_server.model for r in chat_server.requests)
    parts = image_requests[0]["messages"][-1]["content"]
    assert parts[0]["image_url"]["url"].startswith("data:image/png;base64,") and "[image]What is" in parts[1]["text"]
    # load_questions reads the output with the default column names.
    questions, load = load_questions(str(out), DataConfig(), BedConfig(), "train")
    assert load.skipped == 0 and len(questions) == 7
    assert questions[0].paraphrases == rows[0]["paraphrases"] and questions[0].hint_steps == ["Take 2.", "Add 3 to it."]
    assert questions[0].extras["difficulty"] == 5.0 and len(questions[0].images) == 1


def test_rerun_resumes_and_retries_only_failures(chat_server, jsonl_dataset, tmp_path):
    out = tmp_path / "aug.jsonl"
    augment(_cfg(jsonl_dataset, out, chat_server.url))
    assert journal_path(out).is_file()
    asked = len(chat_server.requests)
    chat_server.slow = False  # the server recovered
    report = augment(_cfg(jsonl_dataset, out, chat_server.url))
    assert report.attempted == 1 and report.failed == 0 and report.skipped == 6
    assert len(chat_server.requests) == asked + 2  # one paraphrase and one solve request, for the SLOW row
    rows = _rows(out)
    assert rows[3]["hint_steps"] == ["Take 2.", "Add 2 to it."] and len(rows) == 7
    assert rows[0]["hint_steps"] == ["Take 2.", "Add 3 to it."]  # earlier work kept from the journal
    again = augment(_cfg(jsonl_dataset, out, chat_server.url))
    assert again.attempted == 0 and len(chat_server.requests) == asked + 2


def test_output_can_be_the_input_and_is_skipped_next_time(chat_server, jsonl_dataset):
    augment(_cfg(jsonl_dataset, jsonl_dataset, chat_server.url, parts=("hints",)))
    rows = _rows(jsonl_dataset)
    assert len(rows) == 7 and rows[0]["hint_steps"] and rows[0]["paraphrases"] == []
    assert not any("Rewrite the problem" in json.dumps(r) for r in chat_server.requests)


def test_bad_response_bodies_are_retried_then_left_unaugmented(chat_server, tmp_path):
    inp = tmp_path / "d.jsonl"
    inp.write_text(json.dumps({"problem": "BADJSON What is 1 + 1?", "answer": "2"}) + "\n")
    report = augment(_cfg(inp, tmp_path / "o.jsonl", chat_server.url))
    assert report.failed == 1 and chat_server.hits["solve:BADJSON What is 1 + 1?"] == 2
    assert _rows(tmp_path / "o.jsonl")[0]["hint_steps"] == []


def test_unreadable_row_is_kept_and_counted(chat_server, tmp_path):
    inp = tmp_path / "d.jsonl"
    rows = [{"problem": "<image>What is 1 + 2?", "answer": "3", "images": [str(tmp_path / "missing.png")]},
            {"problem": "What is 1 + 1?", "answer": "2"}]
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = augment(_cfg(inp, tmp_path / "o.jsonl", chat_server.url))
    assert report.rejections.get("unreadable_row") == 1 and len(_rows(tmp_path / "o.jsonl")) == 2
    assert len(chat_server.requests) == 2  # only the readable row was sent


def test_retry_backoff_doubles_and_non_retryable_4xx_stops(chat_server):
    waits = []
    cfg = _teacher(chat_server.url, max_retries=2, backoff_s=1.0, timeout_s=0.2)
    teacher = EndpointTeacher(cfg, sleep=waits.append)
    try:
        reply = teacher.complete([TeacherRequest("Problem:\nSLOW What is 1 + 2?")])[0]
    finally:
        teacher.close()
    assert reply.text is None and "timeout" in reply.error and "3 attempts" in reply.error
    assert len(waits) == 2 and 0.5 <= waits[0] <= 1.0 and 1.0 <= waits[1] <= 2.0
    bad = EndpointTeacher(_teacher(chat_server.url.replace("/v1", "/nope"), model="m"))
    try:
        reply = bad.complete([TeacherRequest("Problem:\nWhat is 1 + 2?")])[0]
    finally:
        bad.close()
    assert reply.text is None and reply.error.startswith("HTTP 404")


def test_chat_url_forms():
    assert chat_url("http://h:8000") == "http://h:8000/v1/chat/completions"
    assert chat_url("http://h:8000/v1/") == "http://h:8000/v1/chat/completions"
    assert chat_url("https://api.x.com/v1/chat/completions") == "https://api.x.com/v1/chat/completions"


def test_cli_augment(chat_server, jsonl_dataset, tmp_path, capsys):
    out = tmp_path / "cli.jsonl"
    code = main(["augment", "--input", str(jsonl_dataset), "--output", str(out), "--teacher", chat_server.url,
                 "--timeout", "0.3", "--retries", "0", "--verify-workers", "0", "--no-progress", "-q",
                 "--paraphrases", "1"])
    assert code == 0 and "wrote 7 rows" in capsys.readouterr().out
    rows = _rows(out)
    assert len(rows) == 7 and rows[1]["paraphrases"] == ["Compute 4 plus 4."]
    assert main(["augment", "--input", str(jsonl_dataset), "--output", str(tmp_path / "x.parquet"),
                 "--teacher", chat_server.url]) == 2
    assert "format" in capsys.readouterr().err


@pytest.mark.parametrize("parts", ["", "paraphrases,nope"])
def test_cli_rejects_bad_parts(parts, jsonl_dataset, tmp_path, capsys):
    code = main(["augment", "--input", str(jsonl_dataset), "--output", str(tmp_path / "o.jsonl"),
                 "--teacher", "http://127.0.0.1:9", "--parts", parts])
    assert code == 2 and "parts" in capsys.readouterr().err
