"""The local-model teacher on the random tiny VLM (garbage out, so: the path and rejection counting),
a tiny text-only model (images withheld), and answer verification in a worker process."""

from __future__ import annotations

import json

import datasets
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from grpo_zoo.augment import AugmentConfig, TeacherConfig, augment
from grpo_zoo.augment.teachers import LocalTeacher, TeacherReply
from grpo_zoo.config import DataConfig
from grpo_zoo.config import TestbedConfig as BedConfig  # "Test*" names confuse pytest collection
from grpo_zoo.data import load_questions
from grpo_zoo.policy import Policy
from grpo_zoo.testbed.tiny_model import build_tiny_vlm

MALFORMED = {"paraphrase_malformed", "hint_malformed", "hint_no_boxed_answer", "hint_wrong_answer",
             "paraphrase_image_tags", "paraphrase_empty", "paraphrase_duplicate", "hint_reveals_answer"}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny model's matrices are too small for threads to pay; on a shared machine they cost several x."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("teacher") / "model", seed=0)


def _parquet(path, n_images=3) -> None:
    """An EasyR1-style parquet written by `datasets` (Image feature metadata included)."""
    images = [[Image.new("RGB", (28, 28), c)] for c in ("red", "green", "blue")][:n_images] + [[]]
    problems = [f"<image>How many shapes are there? ({i})" for i in range(n_images)] + ["What is 1 + 1?"]
    features = datasets.Features({"problem": datasets.Value("string"), "answer": datasets.Value("string"),
                                  "images": datasets.Sequence(datasets.Image())})
    data = {"problem": problems, "answer": [str(i + 1) for i in range(len(problems))], "images": images}
    datasets.Dataset.from_dict(data, features=features).to_parquet(str(path))


class _Spy:
    """Wraps a Policy to record how many images each encoded prompt carried."""

    def __init__(self, policy):
        self.policy, self.images = policy, []

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def encode(self, prompts, **kw):
        self.images.extend(len(p.images) for p in prompts)
        return self.policy.encode(prompts, **kw)


def test_local_vlm_teacher_batched_keeps_rows_and_counts_rejections(tiny_vlm, tmp_path):
    inp, out = tmp_path / "train.parquet", tmp_path / "aug.parquet"
    _parquet(inp)
    spy = _Spy(Policy.from_pretrained(str(tiny_vlm)))
    teacher = LocalTeacher(spy, TeacherConfig(source=str(tiny_vlm), max_new_tokens=12, batch_size=3))
    torch.manual_seed(0)
    report = augment(AugmentConfig(input=str(inp), output=str(out), verify_workers=0, progress=False), teacher)
    assert spy.images == [1, 1, 1, 1, 1, 1, 0, 0]  # images go to the VLM, with both prompts of each row
    assert report.attempted == 4 and report.failed == 0 and report.rejected_rows == 4
    assert set(report.rejections) <= MALFORMED and sum(report.rejections.values()) >= 8
    table = pq.read_table(out)
    assert table.num_rows == 4
    assert table.column("problem").to_pylist() == pq.read_table(inp).column("problem").to_pylist()
    assert table.column("difficulty").to_pylist() == [5.0] * 4
    assert table.column("paraphrases").to_pylist() == [[]] * 4
    questions, load = load_questions(str(out), DataConfig(), BedConfig(), "train")
    assert load.skipped == 0 and len(questions) == 4 and len(questions[0].images) == 1
    assert questions[0].images[0].getpixel((0, 0)) == (255, 0, 0)  # the image bytes survived the rewrite


def test_local_text_only_teacher_gets_no_images(tmp_path):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_zoo.testbed.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, eos_token_id=eos, pad_token_id=eos)
    torch.manual_seed(0)
    model_dir = tmp_path / "text_model"
    Qwen2ForCausalLM(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    inp, out = tmp_path / "train.parquet", tmp_path / "aug.parquet"
    _parquet(inp, n_images=1)
    spy = _Spy(Policy.from_pretrained(str(model_dir)))
    teacher = LocalTeacher(spy, TeacherConfig(source=str(model_dir), max_new_tokens=8, temperature=0))
    assert not teacher.supports_images
    report = augment(AugmentConfig(input=str(inp), output=str(out), verify_workers=0, progress=False), teacher)
    assert spy.images == [0, 0, 0, 0] and report.attempted == 2 and report.failed == 0
    assert pq.read_table(out).num_rows == 2


class _ScriptedTeacher:
    """A teacher whose replies are written by hand: paraphrase prompts and solve prompts by content."""

    supports_images = False
    batch_size = 8

    def __init__(self, solutions):
        self.solutions = solutions

    def complete(self, requests):
        replies = []
        for r in requests:
            problem = r.text.split("Problem:\n", 1)[1].strip()
            if "Rewrite the problem" in r.text:
                replies.append(TeacherReply(f"<paraphrase>Restated: {problem}</paraphrase>"))
            else:
                replies.append(TeacherReply(self.solutions.get(problem)))  # None = a failed request
        return replies

    def close(self):
        pass


def test_latex_answers_verified_in_a_worker_process(tmp_path):
    inp, out = tmp_path / "d.jsonl", tmp_path / "o.jsonl"

    rows = [{"problem": "Half of one?", "answer": "\\frac{1}{2}"}, {"problem": "Two squared?", "answer": "4"},
            {"problem": "Lost?", "answer": "1"}]
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    solutions = {"Half of one?": "<think>hmm \\boxed{7}</think>Step 1: Split one into two parts.\n"
                                 "Step 2: Take one part.\nSo \\boxed{0.5}",
                 "Two squared?": "Step 1: Multiply two by two.\n\\boxed{5}"}
    cfg = AugmentConfig(input=str(inp), output=str(out), verify_workers=1, progress=False)
    report = augment(cfg, _ScriptedTeacher(solutions))
    result = [json.loads(line) for line in out.read_text().splitlines()]
    assert result[0]["hint_steps"] == ["Split one into two parts.", "Take one part."]  # 0.5 == 1/2 by math-verify
    assert result[1]["hint_steps"] == [] and result[1]["paraphrases"] == ["Restated: Two squared?"]
    assert result[2]["hint_steps"] == [] and report.failed == 1  # the solve request failed: retried on rerun
    assert report.rejections == {"hint_wrong_answer": 1}
