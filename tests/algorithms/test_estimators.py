"""Hand-worked examples, loop references and bad inputs for the built-in advantage estimators.

The hand-worked examples carry their arithmetic in comments (std is Bessel, n - 1). The loop
references are deliberately naive Python (lists, dicts, math) so that they share no code
with the vectorised versions; both must agree to 1e-6 on random batches.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch

from grpo_zoo.algorithms import _groups as grp
from grpo_zoo.algorithms.advantages import (
    DrGRPOConfig,
    GRPOConfig,
    GRPOPassKConfig,
    LitePPOConfig,
    OPOConfig,
    ReinforcePPBaselineConfig,
    RLOOConfig,
    dr_grpo,
    grpo,
    grpo_passk,
    opo,
    reinforce_pp_baseline,
    rloo,
)
from grpo_zoo.algorithms.diva import DIVAConfig, diva
from grpo_zoo.algorithms.durian import DurianConfig, durian, spectral_entropy
from grpo_zoo.configuration import ConfigError, build_plugin
from grpo_zoo.registry import ESTIMATORS
from grpo_zoo.types import AdvantageInputs


def make(rewards, pids, qids=None, lengths=None, dtype=torch.float64, **optional) -> AdvantageInputs:
    n = len(rewards)
    lengths = [3] * n if lengths is None else lengths
    mask = (torch.arange(max(lengths + [1])).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).float()
    extras = optional.pop("extras", {})
    opt = {k: torch.tensor(v, dtype=torch.float64) for k, v in optional.items() if v is not None}
    return AdvantageInputs(
        rewards=torch.tensor(rewards, dtype=dtype),
        prompt_ids=torch.tensor(pids),
        question_ids=torch.tensor(pids if qids is None else qids),
        response_mask=mask,
        extras=extras,
        **opt,
    )


def approx(values, expected, tol=1e-5) -> None:
    got = [float(v) for v in values]
    assert got == pytest.approx(expected, abs=tol), got


# ---------------------------------------------------------------------------------------
# Hand-worked examples
# ---------------------------------------------------------------------------------------


def test_grpo_by_hand() -> None:
    # group 0 [1, 0, 0, 1]: mean 0.5; Bessel var = 4 * 0.25 / 3 = 1/3, std 0.577350
    #   A = +-0.5 / 0.577351 = +-0.866024
    # group 1 [2, 2]: std 0 -> (2 - 2) / 1e-6 = 0;  group 2 [3]: one response -> 0
    out = grpo(make([1, 0, 0, 1, 2, 2, 3], [0, 0, 0, 0, 1, 1, 2]), GRPOConfig())
    approx(out.advantages, [0.866024, -0.866024, -0.866024, 0.866024, 0, 0, 0])
    assert out.metrics["zero_std_share"] == pytest.approx(2 / 3)


def test_grpo_batch_scale_and_lite_ppo_by_hand() -> None:
    # rewards [1, 0, 0, 1, 2, 2]: batch mean 1, squared deviations 0,1,1,0,1,1 -> var 4/5, std 0.894427
    # group 0 mean 0.5 -> A = +-0.5 / 0.894428 = +-0.559016; group 1 constant -> 0
    inputs = make([1, 0, 0, 1, 2, 2], [0, 0, 0, 0, 1, 1])
    expected = [0.559016, -0.559016, -0.559016, 0.559016, 0, 0]
    approx(grpo(inputs, GRPOConfig(scale="batch")).advantages, expected)
    entry = ESTIMATORS.get("lite_ppo")
    assert entry.obj is grpo and entry.config_cls is LitePPOConfig  # an alias, not a copy
    approx(entry.obj(inputs, entry.config_cls()).advantages, expected)
    # scale none = dr_grpo: [1, 0, 0, 1] - 0.5
    approx(grpo(inputs, GRPOConfig(scale="none")).advantages, [0.5, -0.5, -0.5, 0.5, 0, 0])


def test_dr_grpo_by_hand() -> None:
    # [1, 0, 0, 1] - 0.5 and [3, 1] - 2; no division by any std
    approx(dr_grpo(make([1, 0, 0, 1, 3, 1], [0, 0, 0, 0, 1, 1]), DrGRPOConfig()).advantages,
           [0.5, -0.5, -0.5, 0.5, 1, -1])


def test_rloo_by_hand() -> None:
    # [1, 0, 0, 1]: A_0 = 1 - mean(0, 0, 1) = 2/3, A_1 = 0 - mean(1, 0, 1) = -2/3
    #   (= G/(G-1) (r - mean) = 4/3 * 0.5); [5] alone has no "others" -> 0
    approx(rloo(make([1, 0, 0, 1, 5], [0, 0, 0, 0, 1]), RLOOConfig()).advantages,
           [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0])


def test_reinforce_pp_baseline_by_hand() -> None:
    # groups [1, 0] and [1]; lengths [2, 1, 1] (4 valid tokens): x = r - local mean = [0.5, -0.5, 0]
    # token mean mu = (2*0.5 - 0.5 + 0) / 4 = 0.125
    # token var = (2*0.375^2 + 0.625^2 + 0.125^2) / (4 - 1) = 0.6875 / 3 = 0.2291667, sqrt = 0.4787136
    # A = (x - mu) / sqrt(var + 1e-8) = [0.375, -0.625, -0.125] / 0.4787136
    out = reinforce_pp_baseline(make([1, 0, 1], [0, 0, 1], lengths=[2, 1, 1]), ReinforcePPBaselineConfig())
    approx(out.advantages, [0.783349, -1.305582, -0.261116])
    # every token masked: nothing to whiten over -> zeros
    approx(reinforce_pp_baseline(make([1, 0], [0, 0], lengths=[0, 0]), ReinforcePPBaselineConfig()).advantages,
           [0, 0])


def test_grpo_passk_by_hand() -> None:
    # [0.2, 0.9, 0.5, 0.1]: best row 1, gap 0.9 - 0.5 = 0.4; mean 0.425,
    # squared deviations 0.050625 + 0.225625 + 0.005625 + 0.105625 = 0.3875 -> var 0.129167, std 0.359398
    # A_1 = 0.4 / 0.359399 = 1.112970, every other row 0.
    # [1, 0, 1]: tie for the best: row 4 (first) gets 1 - 1 = 0, so the whole group is 0.
    inputs = make([0.2, 0.9, 0.5, 0.1, 1, 0, 1], [0, 0, 0, 0, 1, 1, 1])
    approx(grpo_passk(inputs, GRPOPassKConfig()).advantages, [0, 1.112970, 0, 0, 0, 0, 0])
    approx(grpo_passk(inputs, GRPOPassKConfig(norm_by_std=False)).advantages, [0, 0.4, 0, 0, 0, 0, 0])


def test_opo_by_hand() -> None:
    # [1, 0, 1] with lengths [1, 2, 1]: b = (1*1 + 2*0 + 1*1) / 4 = 0.5 (the plain mean would be 2/3)
    # [0.4, 0.2] with lengths [0, 0]: no tokens -> plain mean 0.3
    inputs = make([1, 0, 1, 0.4, 0.2], [0, 0, 0, 1, 1], lengths=[1, 2, 1, 0, 0])
    approx(opo(inputs, OPOConfig()).advantages, [0.5, -0.5, 0.5, 0.1, -0.1])


def diva_example(difficulty):
    # question 0: prompt 0 (original, D = 5) rewards [1, 0]; prompt 1 (variant, D = 7) rewards [1, 1]
    # question 1: prompt 2 (D = 5) rewards [0, 0]
    return make([1, 0, 1, 1, 0, 0], [0, 0, 1, 1, 2, 2], [0, 0, 0, 0, 1, 1], difficulty=difficulty)


def test_diva_by_hand() -> None:
    # a. A_L: prompt 0 std sqrt(0.5) -> +-0.5 / 0.707108 = +-0.707106; prompts 1, 2 constant -> 0
    #    A_G: question 0 [1, 0, 1, 1] mean 0.75, var 0.75 / 3 = 0.25, std 0.5 -> [0.5, -1.5, 0.5, 0.5];
    #         question 1 -> [0, 0]
    # b. z-score over the 6 rows (both means 0): A_L sum of squares 1.0 -> std sqrt(1/5) = 0.447214
    #    -> [1.581139, -1.581139, 0, 0, 0, 0]; A_G sum of squares 3.0 -> std sqrt(3/5) = 0.774597
    #    -> [0.645497, -1.936492, 0.645497, 0.645497, 0, 0]
    # c. Dbar_q0 = (5 + 5 + 7 + 7) / 4 = 6: prompt 0 rows D - Dbar = -1, prompt 1 rows +1; question 1: 0
    #    row 0: A > 0 -> * exp(-0.1) = 0.584068; row 1: A < 0 -> * exp(+0.1) = -2.140158
    #    rows 2, 3: A > 0 -> * exp(+0.1) = 0.713385
    # d. RRB paper: local factors (max - min) / 1 = 1, 0, 0; global 1, 0 -> zero every constant group
    # e. A = A_L + A_G = [2.165207, -3.721297, 0.713385, 0.713385, 0, 0]
    #    (the z-score's eps = 1e-6 on stds of 0.45 and 0.77 moves the 6th digit: tolerance 2e-5)
    out = diva(diva_example([5, 5, 7, 7, 5, 5]), DIVAConfig())
    approx(out.advantages, [2.165207, -3.721297, 0.713385, 0.713385, 0, 0], tol=2e-5)
    assert out.metrics["difficulty_missing"] == 0.0
    assert out.metrics["weighted_share"] == pytest.approx(4 / 6)
    assert out.metrics["difficulty_share_5"] == pytest.approx(4 / 6)
    # without difficulty every weight is 1: A = A_L + z(A_G) and the metric says so
    out = diva(diva_example(None), DIVAConfig())
    approx(out.advantages, [1.581139 + 0.645497, -1.581139 - 1.936492, 0.645497, 0.645497, 0, 0], tol=2e-5)
    assert out.metrics["difficulty_missing"] == 1.0 and out.metrics["weighted_share"] == 0.0


def test_diva_authors_rrb_by_hand() -> None:
    # one prompt per question, no z-score, no weighting: A_L = A_G = GRPO
    # [0.1, 0.0]: every reward < 0.15 -> both terms * 0.1: 2 * 0.1 * 0.707106 = 0.141421
    # [1.0, 0.0]: max 1.0 >= 0.15 -> unchanged: 2 * 0.707106 = 1.414212
    inputs = make([0.1, 0.0, 1.0, 0.0], [0, 0, 1, 1])
    cfg = DIVAConfig(rrb="authors", normalize="none", k=0.0)
    approx(diva(inputs, cfg).advantages, [0.141421, -0.141421, 1.414212, -1.414212])
    # paper form with R_max = 2: [0.1, 0] -> factor 0.05; [1, 0] -> factor 0.5
    cfg = DIVAConfig(rrb="paper", normalize="none", k=0.0)
    inputs = make([0.1, 0.0, 1.0, 0.0], [0, 0, 1, 1], extras={"reward_max": 2.0})
    approx(diva(inputs, cfg).advantages, [2 * 0.05 * 0.707106, -2 * 0.05 * 0.707106, 0.707106, -0.707106])


def test_durian_reasoning_view_by_hand() -> None:
    # 4 prompts of 2; c_p = mean summed log-prob: p0 -1, p1 -2, p2 -10, p3 -20; bins = 2
    # ranks ascending: p3 0, p2 1, p1 2, p0 3 -> bin = rank * 2 // 4: p3, p2 -> 0; p1, p0 -> 1
    # bin 1 pools [1, 0, 1, 1]: std 0.5 -> p0 A_reason = (r - 0.5) / 0.5 = +-1; p1 constant -> 0
    # bin 0 pools [0, 0, 1, 0.5]: mean 0.375, var 0.6875 / 3, std 0.478714 -> p3 A_reason = +-0.25 / 0.478714
    # A_grpo: p0 +-0.707106, p3 [1, 0.5] std 0.353553 -> +-0.707104
    # no visual_entropy: weights 0.4, 0.3 renormalised to 4/7, 3/7
    # p0: 4/7 * 0.707106 + 3/7 * 1 = 0.832632;  p3: 4/7 * 0.707104 + 3/7 * 0.522233 = 0.627874
    inputs = make([1, 0, 1, 1, 0, 0, 1, 0.5], [0, 0, 1, 1, 2, 2, 3, 3],
                  seq_logprob=[-1, -1, -2, -2, -10, -10, -20, -20])
    out = durian(inputs, DurianConfig(bins=2))
    approx(out.advantages, [0.832632, -0.832632, 0, 0, 0, 0, 0.627874, -0.627874])
    assert out.metrics["percep_used"] == 0.0 and out.metrics["reason_used"] == 1.0
    assert out.metrics["weight_grpo"] == pytest.approx(4 / 7)


def test_durian_perceptual_view_by_hand() -> None:
    # H per prompt [0, 1, 2, 3]: q25 = 0.75, q75 = 2.25 -> groups p0: low, p1, p2: middle, p3: high
    # middle pools p1 [1, 0] and p2 [1, 1]: std 0.5 -> p1 A_percep = +-1
    # p0 [1, 0] and p3 [0, 1] are alone in their groups -> A_percep = A_grpo = +-0.707106
    # no seq_logprob: weights 4/7 (grpo), 3/7 (percep)
    # p1: 4/7 * 0.707106 + 3/7 * 1 = 0.832632
    inputs = make([1, 0, 1, 0, 1, 1, 0, 1], [0, 0, 1, 1, 2, 2, 3, 3],
                  visual_entropy=[0, 0, 1, 1, 2, 2, 3, 3])
    out = durian(inputs, DurianConfig())
    approx(out.advantages, [0.707106, -0.707106, 0.832632, -0.832632, 0, 0, -0.707106, 0.707106])
    assert out.metrics["percep_q25"] == pytest.approx(0.75) and out.metrics["percep_q75"] == pytest.approx(2.25)


def test_spectral_entropy_by_hand() -> None:
    # four patches +-e1, +-e2: already centred, singular values sqrt(2), sqrt(2) -> p = [0.5, 0.5], H = ln 2
    f = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    assert float(spectral_entropy(f)) == pytest.approx(math.log(2))
    assert float(spectral_entropy(f + 5.0)) == pytest.approx(math.log(2), abs=1e-5)  # centring removes shifts
    # rank one after centring -> one non-zero singular value -> H = 0; one patch or constant features -> 0
    assert float(spectral_entropy(torch.tensor([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]]))) == pytest.approx(0, abs=1e-6)
    assert float(spectral_entropy(torch.ones(1, 8))) == 0.0
    assert float(spectral_entropy(torch.full((6, 4), 3.0))) == 0.0
    # batched [B, P, d] equals one call per image; bf16 input is computed in float32
    batch = torch.randn(3, 10, 6, generator=torch.Generator().manual_seed(0))
    singles = torch.stack([spectral_entropy(b) for b in batch])
    assert torch.allclose(spectral_entropy(batch), singles)
    assert spectral_entropy(batch.bfloat16()).dtype == torch.float32
    # d equal spread directions -> H = ln d at most
    assert float(spectral_entropy(batch).max()) <= math.log(6) + 1e-6
    with pytest.raises(ValueError, match="features"):
        spectral_entropy(torch.ones(4))
    with pytest.raises(ValueError, match="NaN"):
        spectral_entropy(torch.tensor([[float("nan"), 0.0]]))


# ---------------------------------------------------------------------------------------
# Group helpers
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("ids", [[7, 7, 3, 3, 9], [5, 1, 5, 1, 5], [2, 2, 2], [-4, 10, 10, 10**12], [0]])
def test_dense_ids_matches_unique(ids) -> None:
    t = torch.tensor(ids)
    labels, k = grp.dense_ids(t)
    uniq, inverse = torch.unique(t, return_inverse=True)
    assert k == uniq.numel() and torch.equal(labels, inverse)


def test_group_extremes() -> None:
    v = torch.tensor([1.0, 0.0, 1.0, 5.0, 2.0])
    idx = torch.tensor([0, 0, 0, 1, 1])
    assert grp.group_first_argmax(v, idx, 2).tolist() == [0, 3]  # ties: first row
    assert grp.group_second_max(v, idx, 2).tolist() == [1.0, 2.0]
    assert grp.group_min(v, idx, 2).tolist() == [0.0, 2.0]
    assert grp.group_std(v, idx, 2).tolist() == pytest.approx([math.sqrt(1 / 3), math.sqrt(4.5)])
    huge = torch.full((4,), 123456.789, dtype=torch.float64)
    assert grp.group_mean_exact(huge, torch.zeros(4, dtype=torch.long), 1).item() == 123456.789


# ---------------------------------------------------------------------------------------
# Loop references (plain Python) vs the vectorised estimators
# ---------------------------------------------------------------------------------------


def rows_by(ids):
    out = defaultdict(list)
    for i, g in enumerate(ids):
        out[g].append(i)
    return dict(sorted(out.items()))


def mean(xs):
    return sum(xs) / len(xs)


def std(xs):
    if len(xs) < 2:
        return 0.0
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def ref_grpo(r, ids, eps=1e-6):
    out = [0.0] * len(r)
    for rows in rows_by(ids).values():
        vals = [r[i] for i in rows]
        for i in rows:
            out[i] = (r[i] - mean(vals)) / (std(vals) + eps)
    return out


def ref_dr_grpo(r, ids):
    out = [0.0] * len(r)
    for rows in rows_by(ids).values():
        for i in rows:
            out[i] = r[i] - mean([r[j] for j in rows])
    return out


def ref_rloo(r, ids):
    out = [0.0] * len(r)
    for rows in rows_by(ids).values():
        for i in rows:
            others = [r[j] for j in rows if j != i]
            out[i] = r[i] - mean(others) if others else 0.0
    return out


def ref_opo(r, ids, lengths):
    out = [0.0] * len(r)
    for rows in rows_by(ids).values():
        total = sum(lengths[j] for j in rows)
        b = sum(lengths[j] * r[j] for j in rows) / total if total else mean([r[j] for j in rows])
        for i in rows:
            out[i] = r[i] - b if len(rows) > 1 else 0.0
    return out


def ref_passk(r, ids, eps=1e-6):
    out = [0.0] * len(r)
    for rows in rows_by(ids).values():
        vals = [r[i] for i in rows]
        best = rows[vals.index(max(vals))]
        second = max(r[j] for j in rows if j != best)
        out[best] = (r[best] - second) / (std(vals) + eps)
    return out


def ref_diva(r, pid, qid, lengths, d, cfg: DIVAConfig, r_max=1.0):
    n = len(r)
    a_l, a_g = ref_grpo(r, pid, cfg.eps), ref_grpo(r, qid, cfg.eps)
    qrows = rows_by(qid)
    d = d or [0.0] * n
    expo = [cfg.k * (d[i] - mean([d[j] for j in qrows[qid[i]]])) for i in range(n)]

    def weight(a):
        return [math.exp(expo[i] * ((a[i] > 0) - (a[i] < 0))) * a[i] for i in range(n)]

    def zscore(a):
        valid = [i for i in range(n) if lengths[i] > 0] or list(range(n))
        vals = [a[i] for i in valid]
        m, s = mean(vals), std(vals)
        return [(a[i] - m) / (s + cfg.eps) if i in valid else 0.0 for i in range(n)]

    def rrb(a, ids):
        out = list(a)
        for rows in rows_by(ids).values():
            vals = [r[i] for i in rows]
            if cfg.rrb == "paper":
                f = (max(vals) - min(vals)) / r_max
            else:
                f = cfg.rrb_factor if all(v < cfg.rrb_threshold for v in vals) else 1.0
            for i in rows:
                out[i] *= f
        return out

    both = cfg.weight_on == "both"
    if cfg.weight_stage == "before_norm":
        a_g, a_l = weight(a_g), weight(a_l) if both else a_l
    if cfg.normalize == "zscore":
        a_l, a_g = zscore(a_l), zscore(a_g)
    if cfg.weight_stage == "after_norm":
        a_g, a_l = weight(a_g), weight(a_l) if both else a_l
    if cfg.rrb != "none":
        a_l = rrb(a_l, pid) if cfg.rrb_on in ("both", "local") else a_l
        a_g = rrb(a_g, qid) if cfg.rrb_on in ("both", "global") else a_g
    return [cfg.alpha * a_l[i] + cfg.beta * a_g[i] for i in range(n)]


def quantile(xs, q):
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (pos - lo) * (xs[hi] - xs[lo])


def ref_durian(r, pid, lengths, seq, h, cfg: DurianConfig):
    n = len(r)
    prompts = rows_by(pid)  # prompt id -> rows, in ascending id order
    local_mean = {p: mean([r[i] for i in rows]) for p, rows in prompts.items()}

    def shared(group_of):  # group_of: prompt id -> difficulty group
        pooled = defaultdict(list)
        for p, rows in prompts.items():
            pooled[group_of[p]] += [r[i] for i in rows]
        return [(r[i] - local_mean[pid[i]]) / (std(pooled[group_of[pid[i]]]) + cfg.eps) for i in range(n)]

    terms = [(cfg.a_ori, ref_grpo(r, pid, cfg.eps))]
    if h is not None:
        hp = {p: h[rows[0]] for p, rows in prompts.items()}
        q25, q75 = quantile(list(hp.values()), 0.25), quantile(list(hp.values()), 0.75)
        terms.append((cfg.a_percep, shared({p: 0 if v <= q25 else 2 if v >= q75 else 1 for p, v in hp.items()})))
    if seq is not None:
        def score(i):
            return seq[i] / max(lengths[i], 1) if cfg.length_normalize else seq[i]

        conf = {p: mean([score(i) for i in rows]) for p, rows in prompts.items()}
        order = sorted(conf, key=lambda p: conf[p])  # stable: ties keep ascending prompt id
        terms.append((cfg.a_reason, shared({p: rank * cfg.bins // len(order) for rank, p in enumerate(order)})))
    total = sum(w for w, _ in terms)
    return [sum(w / total * a[i] for w, a in terms) for i in range(n)]


def random_batch(seed: int, min_group: int = 1, prompts_per_question: int = 2):
    g = torch.Generator().manual_seed(seed)
    pid, qid, prompt_no = [], [], []
    num_p = int(torch.randint(3, 20, (1,), generator=g))
    for p in range(num_p):
        size = int(torch.randint(min_group, 7, (1,), generator=g))
        pid += [1000 - 7 * p] * size  # descending, non-contiguous ids
        qid += [p // prompts_per_question] * size
        prompt_no += [p] * size
    n = len(pid)
    order = torch.randperm(n, generator=g).tolist()
    rewards = torch.rand(n, generator=g)
    rewards = torch.where(torch.rand(n, generator=g) < 0.4, rewards.round(), rewards).tolist()  # many ties
    d = (1 + 8 * torch.rand(num_p, generator=g)).tolist()
    h = torch.rand(num_p, generator=g).tolist()
    cols = {
        "r": rewards,
        "pid": pid,
        "qid": qid,
        "lengths": torch.randint(0, 6, (n,), generator=g).tolist(),
        "seq": (-30 * torch.rand(n, generator=g)).tolist(),
        "d": [d[p] for p in prompt_no],
        "h": [h[p] for p in prompt_no],
    }
    return {k: [v[i] for i in order] for k, v in cols.items()}


def inputs_of(b, with_d=True, with_seq=True, with_h=True) -> AdvantageInputs:
    return make(b["r"], b["pid"], b["qid"], b["lengths"], difficulty=b["d"] if with_d else None,
                seq_logprob=b["seq"] if with_seq else None, visual_entropy=b["h"] if with_h else None)


def agree(out, ref) -> None:
    assert torch.allclose(out.advantages, torch.tensor(ref, dtype=torch.float64), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_baselines_match_loop_reference(seed: int) -> None:
    b = random_batch(seed)
    inputs = inputs_of(b)
    agree(grpo(inputs, GRPOConfig()), ref_grpo(b["r"], b["pid"]))
    agree(dr_grpo(inputs, DrGRPOConfig()), ref_dr_grpo(b["r"], b["pid"]))
    agree(rloo(inputs, RLOOConfig()), ref_rloo(b["r"], b["pid"]))
    agree(opo(inputs, OPOConfig()), ref_opo(b["r"], b["pid"], b["lengths"]))
    b2 = random_batch(seed, min_group=2)
    agree(grpo_passk(inputs_of(b2), GRPOPassKConfig()), ref_passk(b2["r"], b2["pid"]))


DIVA_CONFIGS = [
    DIVAConfig(),
    DIVAConfig(weight_stage="before_norm", weight_on="both", k=0.3),
    DIVAConfig(rrb="authors", rrb_on="global", alpha=0.5, beta=2.0),
    DIVAConfig(rrb="none", normalize="none", rrb_threshold=0.5),
    DIVAConfig(rrb="authors", rrb_on="local", rrb_threshold=0.6, rrb_factor=0.2, weight_on="both"),
]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("cfg", DIVA_CONFIGS, ids=lambda c: f"{c.weight_stage}-{c.weight_on}-{c.rrb}-{c.rrb_on}")
def test_diva_matches_loop_reference(seed: int, cfg: DIVAConfig) -> None:
    b = random_batch(seed, prompts_per_question=1 + seed)
    agree(diva(inputs_of(b), cfg), ref_diva(b["r"], b["pid"], b["qid"], b["lengths"], b["d"], cfg))
    agree(diva(inputs_of(b, with_d=False), cfg), ref_diva(b["r"], b["pid"], b["qid"], b["lengths"], None, cfg))


DURIAN_CONFIGS = [DurianConfig(), DurianConfig(bins=3, length_normalize=True), DurianConfig(bins=50, a_ori=0.0)]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("cfg", DURIAN_CONFIGS, ids=lambda c: f"b{c.bins}-{c.length_normalize}-{c.a_ori}")
@pytest.mark.parametrize("views", [(True, True), (False, True), (True, False)], ids=["both", "no_image", "no_seq"])
def test_durian_matches_loop_reference(seed: int, cfg: DurianConfig, views) -> None:
    b = random_batch(seed)
    with_h, with_seq = views
    got = durian(inputs_of(b, with_seq=with_seq, with_h=with_h), cfg)
    ref = ref_durian(b["r"], b["pid"], b["lengths"], b["seq"] if with_seq else None, b["h"] if with_h else None, cfg)
    agree(got, ref)


# ---------------------------------------------------------------------------------------
# Bad input and bad config
# ---------------------------------------------------------------------------------------


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(ValueError, match="rewards"):
        make([1.0, float("nan")], [0, 0])
    with pytest.raises(ValueError, match="empty"):
        make([], [])
    with pytest.raises(ValueError, match="prompt_ids"):
        AdvantageInputs(torch.ones(3), torch.zeros(2, dtype=torch.long), torch.zeros(3, dtype=torch.long),
                        torch.ones(3, 2))
    with pytest.raises(ValueError, match="response_mask"):
        AdvantageInputs(torch.ones(3), torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long),
                        torch.ones(2, 2))
    with pytest.raises(ValueError, match="difficulty"):
        make([1.0, 0.0], [0, 0], difficulty=[1.0])


def test_estimators_raise_for_their_own_needs() -> None:
    with pytest.raises(ValueError, match=r"G >= 2.*prompt id 5"):
        grpo_passk(make([1.0, 0.0, 1.0], [4, 4, 5]), GRPOPassKConfig())
    with pytest.raises(ValueError, match="reward_max"):
        diva(make([1.0, 0.0], [0, 0], extras={"reward_max": 0.0}), DIVAConfig())
    with pytest.raises(ValueError, match="visual_entropy"):
        durian(make([1.0, 0.0], [0, 0], visual_entropy=[1.0, 2.0]), DurianConfig())
    with pytest.raises(ValueError, match="a_ori"):
        durian(make([1.0, 0.0], [0, 0]), DurianConfig(a_ori=0.0))


@pytest.mark.parametrize(
    "factory, field",
    [
        (lambda: GRPOConfig(eps=0.0), "grpo.eps"),
        (lambda: GRPOConfig(scale="batches"), "grpo.scale"),
        (lambda: GRPOPassKConfig(eps=-1.0), "grpo_passk.eps"),
        (lambda: ReinforcePPBaselineConfig(eps=0.0), "reinforce_pp_baseline.eps"),
        (lambda: DIVAConfig(rrb="both"), "diva.rrb"),
        (lambda: DIVAConfig(k=float("nan")), "diva.k"),
        (lambda: DurianConfig(bins=0), "durian.bins"),
        (lambda: DurianConfig(a_percep=-0.1), "durian.a_percep"),
        (lambda: DurianConfig(a_ori=0, a_percep=0, a_reason=0), "a_ori"),
    ],
)
def test_bad_config_names_the_field(factory, field: str) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        factory()


def test_configs_build_from_yaml_mappings() -> None:
    spec = build_plugin(ESTIMATORS, {"name": "lite_ppo", "scale": "group"}, "estimator")
    assert isinstance(spec.config, LitePPOConfig) and spec.config.scale == "group"
    assert build_plugin(ESTIMATORS, "lite_ppo", "estimator").config.scale == "batch"
    spec = build_plugin(ESTIMATORS, {"name": "diva", "rrb": "authors", "k": "1e-1"}, "estimator")
    assert spec.config.rrb == "authors" and spec.config.k == pytest.approx(0.1)
    with pytest.raises(ConfigError, match="Did you mean 'batch'"):
        build_plugin(ESTIMATORS, {"name": "grpo", "scale": "bach"}, "estimator")
