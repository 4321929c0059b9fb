"""One shared property test for every registered advantage estimator (STYLE.md).

Parametrised over ESTIMATORS.names(), so an estimator added later (built in or from an entry
point) is covered without touching this file. Universal properties: finite output of shape
[N], masked tokens zero after broadcast_advantages, permutation equivariance inside a local
group. Properties only some methods promise are declared in CAPABILITIES; an estimator not
listed there gets only the universal ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_zoo.registry import ESTIMATORS
from grpo_zoo.types import AdvantageInputs, broadcast_advantages


@dataclass(frozen=True)
class Capabilities:
    zero_for_equal_group: bool = False  # an all-equal local group gets exactly zero advantage
    independent_questions: bool = False  # no batch-level statistic: other questions do not matter
    min_group_size: int = 1  # smaller local groups must raise ValueError instead


CAPABILITIES = {
    "grpo": Capabilities(zero_for_equal_group=True, independent_questions=True),
    "lite_ppo": Capabilities(zero_for_equal_group=True),  # batch std
    "dr_grpo": Capabilities(zero_for_equal_group=True, independent_questions=True),
    "rloo": Capabilities(zero_for_equal_group=True, independent_questions=True),
    "opo": Capabilities(zero_for_equal_group=True, independent_questions=True),
    "grpo_passk": Capabilities(zero_for_equal_group=True, independent_questions=True, min_group_size=2),
    "reinforce_pp_baseline": Capabilities(),  # token whitening shifts every row by the batch mean
    "diva": Capabilities(),  # batch z-score; global groups span other prompts
    "durian": Capabilities(zero_for_equal_group=True),  # difficulty groups span the batch
}

ALL = ESTIMATORS.names()
T = 5  # response tokens in the generated batches


def caps(name: str) -> Capabilities:
    return CAPABILITIES.get(name, Capabilities())


# ---------------------------------------------------------------------------------------
# Batch generation
# ---------------------------------------------------------------------------------------

REGIMES = {
    "unit": st.floats(0.0, 1.0),
    "binary": st.sampled_from([0.0, 1.0]),
    "huge": st.floats(-1e6, 1e6),
    "tiny": st.floats(0.0, 1e-8),
    "equal": st.just(0.5),
}


@st.composite
def batches(draw: st.DrawFn, min_group: int = 1) -> dict:
    """A batch spec: questions with 1-3 prompts each, 1-5 responses per prompt, arbitrary ids."""
    num_q = draw(st.integers(1, 4))
    sizes = [[draw(st.integers(min_group, 5)) for _ in range(draw(st.integers(1, 3)))] for _ in range(num_q)]
    num_p = sum(len(s) for s in sizes)
    qid_values = draw(st.lists(st.integers(-10**6, 10**6), min_size=num_q, max_size=num_q, unique=True))
    pid_values = draw(st.lists(st.integers(-10**6, 10**6), min_size=num_p, max_size=num_p, unique=True))
    pid, qid, prompt_no = [], [], []
    p = 0
    for q, group_sizes in enumerate(sizes):
        for g in group_sizes:
            pid += [pid_values[p]] * g
            qid += [qid_values[q]] * g
            prompt_no += [p] * g
            p += 1
    n = len(pid)
    regime = draw(st.sampled_from(sorted(REGIMES)))
    rewards = draw(st.lists(REGIMES[regime], min_size=n, max_size=n))
    order = draw(st.permutations(range(n))) if draw(st.booleans()) else list(range(n))  # rows need not be sorted
    per_prompt_d = draw(st.lists(st.floats(-7, 17), min_size=num_p, max_size=num_p))
    per_prompt_h = draw(st.lists(st.integers(0, 5), min_size=num_p, max_size=num_p))
    return {
        "rewards": [rewards[i] for i in order],
        "pid": [pid[i] for i in order],
        "qid": [qid[i] for i in order],
        "lengths": [draw(st.integers(0, T)) for _ in range(n)],
        # integer-valued log-probs: group sums are exact in any order, so a permutation cannot flip a rank
        "seq_logprob": [float(draw(st.integers(-60, 0))) for _ in range(n)],
        "difficulty": [per_prompt_d[prompt_no[i]] for i in order],
        "visual_entropy": [float(per_prompt_h[prompt_no[i]]) for i in order],
        "optional": draw(st.booleans()),  # supply difficulty / seq_logprob / visual_entropy
        "dtype": draw(st.sampled_from([torch.float32, torch.float64])),
    }


def to_inputs(spec: dict) -> AdvantageInputs:
    n = len(spec["rewards"])
    mask = (torch.arange(T).unsqueeze(0) < torch.tensor(spec["lengths"]).unsqueeze(1)).float()  # [N, T]
    optional = {}
    if spec["optional"]:
        names = ("difficulty", "seq_logprob", "visual_entropy")
        optional = {k: torch.tensor(spec[k], dtype=torch.float32) for k in names}
    return AdvantageInputs(
        rewards=torch.tensor(spec["rewards"], dtype=spec["dtype"]),
        prompt_ids=torch.tensor(spec["pid"], dtype=torch.long).reshape(n),
        question_ids=torch.tensor(spec["qid"], dtype=torch.long).reshape(n),
        response_mask=mask,
        **optional,
    )


def permuted(spec: dict, perm: list[int]) -> dict:
    out = dict(spec)
    for key in ("rewards", "pid", "qid", "lengths", "seq_logprob", "difficulty", "visual_entropy"):
        out[key] = [spec[key][i] for i in perm]
    return out


def run(name: str, spec: dict) -> torch.Tensor:
    entry = ESTIMATORS.get(name)
    return entry.obj(to_inputs(spec), entry.config_cls()).advantages


def close(a: torch.Tensor, b: torch.Tensor, scale: float) -> bool:
    a, b = a.double(), b.double()
    return bool(torch.allclose(a, b, rtol=1e-5, atol=1e-6 * max(1.0, scale)))


def scale_of(spec: dict, adv: torch.Tensor) -> float:
    return max([abs(x) for x in spec["rewards"]] + [float(adv.abs().max())])


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
@SETTINGS
@given(spec=batches())
def test_finite_shape_and_masked_zero(name: str, spec: dict) -> None:
    inputs = to_inputs(spec)
    small = min(inputs.prompt_ids.unique(return_counts=True)[1].tolist())
    entry = ESTIMATORS.get(name)
    if small < caps(name).min_group_size:
        with pytest.raises(ValueError, match="prompt_ids"):
            entry.obj(inputs, entry.config_cls())
        return
    out = entry.obj(inputs, entry.config_cls())
    assert out.advantages.shape == (inputs.num_responses,)
    assert torch.isfinite(out.advantages).all()
    assert all(isinstance(v, float) for v in out.metrics.values())
    token_adv = broadcast_advantages(out.advantages, inputs.response_mask)  # [N, T]
    assert (token_adv[inputs.response_mask == 0] == 0).all()


@pytest.mark.parametrize("name", ALL)
@SETTINGS
@given(spec=batches(min_group=2), data=st.data())
def test_permutation_equivariant_inside_a_local_group(name: str, spec: dict, data: st.DataObject) -> None:
    base = run(name, spec)
    target = data.draw(st.sampled_from(sorted(set(spec["pid"]))))
    rows = [i for i, p in enumerate(spec["pid"]) if p == target]
    shuffled = data.draw(st.permutations(rows))
    perm = list(range(len(spec["pid"])))
    for src, dst in zip(rows, shuffled):
        perm[src] = dst  # row src of the new batch is row dst of the old one
    moved = run(name, permuted(spec, perm))
    assert close(moved, base[perm], scale_of(spec, base))


@pytest.mark.parametrize("name", [n for n in ALL if caps(n).zero_for_equal_group])
@SETTINGS
@given(spec=batches(min_group=2), data=st.data())
def test_all_equal_local_group_gets_zero(name: str, spec: dict, data: st.DataObject) -> None:
    target = data.draw(st.sampled_from(sorted(set(spec["pid"]))))
    value = data.draw(st.sampled_from([0.0, 1.0, 0.3, 1e6, 1e-8]))
    spec["rewards"] = [value if p == target else r for r, p in zip(spec["rewards"], spec["pid"])]
    adv = run(name, spec)
    rows = torch.tensor([p == target for p in spec["pid"]])
    assert (adv[rows].abs() <= 1e-6).all()


@pytest.mark.parametrize("name", [n for n in ALL if caps(n).independent_questions])
@SETTINGS
@given(spec=batches(min_group=2), data=st.data())
def test_questions_are_independent(name: str, spec: dict, data: st.DataObject) -> None:
    base = run(name, spec)
    target = data.draw(st.sampled_from(sorted(set(spec["qid"]))))
    new = dict(spec)
    new["rewards"] = [
        data.draw(st.floats(-10, 10)) if q == target else r for r, q in zip(spec["rewards"], spec["qid"])
    ]
    changed = run(name, new)
    others = torch.tensor([q != target for q in spec["qid"]])
    assert close(changed[others], base[others], scale_of(spec, base))


@pytest.mark.parametrize("name", ALL)
def test_single_response_batch_is_safe(name: str) -> None:
    inputs = AdvantageInputs(torch.tensor([0.7]), torch.tensor([3]), torch.tensor([9]), torch.ones(1, 4))
    entry = ESTIMATORS.get(name)
    if caps(name).min_group_size > 1:
        with pytest.raises(ValueError, match="G >= 2"):
            entry.obj(inputs, entry.config_cls())
        return
    out = entry.obj(inputs, entry.config_cls())
    assert torch.isfinite(out.advantages).all() and out.advantages.shape == (1,)
