"""The error-budget controller: which bar the labels prove, and how it moves."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from cache.semantic.budget import OPEN_LABELS, BudgetGrid, grid_edges, wilson_upper, z_of
from cache.semantic.budget_prior import DEFAULT_PRIOR, Prior, load_prior
from cache.semantic.rivals import RIVAL_COSINE
from cache.semantic.verifier import DEFAULT_ARTIFACT


def test_wilson_bound_is_above_the_rate_and_shrinks_with_evidence() -> None:
    z = z_of(0.05)
    assert z == pytest.approx(1.645, abs=1e-3)
    assert wilson_upper(0, 0, z) == 1.0
    assert wilson_upper(0, 150, z) < 0.02 < wilson_upper(0, 100, z)
    assert wilson_upper(5, 100, z) > 0.05
    assert wilson_upper(50, 1000, z) < wilson_upper(5, 100, z)


def label_many(g: BudgetGrid, cos: float, score: float, n: int, wrong: int) -> None:
    for i in range(n):
        g.observe(cos, score)
        g.label(cos, score, agree=i >= wrong)


def test_starts_closed_and_serves_nothing_without_labels() -> None:
    g = BudgetGrid(0.10, floor=0.88, p_min=0.495)
    bar = g.bar()
    assert not bar.open and not bar.serves(0.999, 0.99)
    assert math.isnan(bar.estimate)


def test_loosens_only_as_far_as_the_labels_prove() -> None:
    g = BudgetGrid(0.10, floor=0.88, p_min=0.495)
    label_many(g, 0.985, 0.6, 200, wrong=4)  # 2 % wrong: proven
    label_many(g, 0.905, 0.3, 200, wrong=80)  # 40 % wrong: must stay out
    bar = g.bar()
    assert bar.open and bar.serves(0.985, 0.6)
    assert not bar.serves(0.905, 0.3)
    assert bar.bound <= 0.10 and bar.labels >= 200
    # a looser region with moderate error joins only while the pooled bound stays in budget
    label_many(g, 0.95, 0.45, 100, wrong=8)
    wider = g.bar()
    assert wider.serves(0.95, 0.45) and wider.bound <= 0.10


def test_a_budget_of_two_percent_needs_more_evidence_than_ten() -> None:
    strict, loose = (BudgetGrid(b, floor=0.88, p_min=0.495) for b in (0.02, 0.10))
    for g in (strict, loose):
        label_many(g, 0.985, 0.6, 120, wrong=2)
    assert loose.bar().open and not strict.bar().open


def test_wrong_labels_in_the_served_region_tighten_at_once() -> None:
    g = BudgetGrid(0.10, floor=0.88, p_min=0.495)
    label_many(g, 0.985, 0.6, 100, wrong=2)
    label_many(g, 0.93, 0.5, 100, wrong=2)
    assert g.bar().serves(0.93, 0.5)
    label_many(g, 0.93, 0.5, 25, wrong=25)  # that cell turns out bad
    bar = g.bar()
    assert not bar.serves(0.93, 0.5) and bar.serves(0.985, 0.6)


def test_prefers_the_proven_bar_that_serves_the_most_traffic() -> None:
    g = BudgetGrid(0.10, floor=0.88, p_min=0.495)
    label_many(g, 0.985, 0.6, 100, wrong=0)
    label_many(g, 0.97, 0.6, 100, wrong=1)
    for _ in range(1000):  # most lookups land on the looser cell
        g.observe(0.97, 0.6)
    assert g.bar().serves(0.97, 0.6)


def test_never_below_the_verifier_floor() -> None:
    g = BudgetGrid(0.10, floor=0.88, p_min=0.495)
    assert g.cell(0.87, 0.9) is None
    label_many(g, 0.87, 0.9, 500, wrong=0)
    assert not g.bar().open


def test_config_keys_are_validated() -> None:
    from pydantic import ValidationError

    from cache.settings import SemanticPolicy

    assert SemanticPolicy().max_error_rate is None  # absent: today's static point
    with pytest.raises(ValidationError, match="judge"):
        SemanticPolicy(enabled=True, max_error_rate=0.05, answer_match="judge")
    with pytest.raises(ValidationError):
        SemanticPolicy(max_error_rate=1.5)
    with pytest.raises(ValidationError):
        SemanticPolicy(audit_rate=0.2)  # audits never exceed 10 % of hits
    # an infinite half-life ("never fade") stopped the stage at start-up with Redis
    # configured, and 1e300 failed every flush of the shared counts
    for bad in (float("inf"), float("nan"), 1e300):
        with pytest.raises(ValidationError, match="label_half_life"):
            SemanticPolicy(max_error_rate=0.05, label_half_life=bad)
    judge = {"url": "http://127.0.0.1:1/v1", "model": "j"}
    ok = SemanticPolicy(max_error_rate=0.05, answer_match="judge", judge=judge)
    assert ok.judge is not None and ok.judge.model == "j"


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        # a judge URL that cannot be called would fail every label later, quietly
        ({"judge": {"url": "localhost:8000/v1/chat/completions", "model": "j"}}, "http(s) URL"),
        ({"judge": {"url": "ftp://judge/v1", "model": "j"}}, "http(s) URL"),
        ({"judge": {"url": "", "model": "j"}}, "http(s) URL"),
        ({"judge": {"url": "http://judge/v1", "model": ""}}, "at least 1 character"),
        ({"judge": {"url": "http://judge/v1", "backend": "b", "model": "j"}}, "one of backend"),
        ({"judge": {"model": "j"}}, "one of backend"),
        # keys that only a budget reads, set without one, would do nothing: said at load
        ({"max_error_rate": None}, "answer_match, judge only apply with max_error_rate"),
        ({"max_error_rate": None, "audit_rate": 0.1}, "answer_match, audit_rate, judge only"),
        ({"answer_match": "exact"}, "a judge is set but answer_match is 'exact'"),
    ],
)
def test_budget_keys_that_would_do_nothing_are_refused(
    keys: dict[str, object], message: str
) -> None:
    from pydantic import ValidationError

    from cache.settings import SemanticPolicy

    base: dict[str, object] = {
        "max_error_rate": 0.05,
        "answer_match": "judge",
        "judge": {"url": "http://judge/v1", "model": "j"},
    }
    with pytest.raises(ValidationError, match=re.escape(message)):
        SemanticPolicy.model_validate({**base, **keys})
    SemanticPolicy.model_validate(base)  # the base itself is fine


def test_a_policy_written_out_whole_loads_back() -> None:
    # /admin/config shows every field, defaults included: saved as a config, it must load
    from cache.settings import SemanticPolicy

    plain = SemanticPolicy(enabled=True)
    assert SemanticPolicy.model_validate(plain.model_dump()) == plain


# -- the prior: development tables, mixed by what the live labels look like ------------------

EDGES = grid_edges(0.88, 0.495)


def table(rows: dict[tuple[float, float], tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    n, k = (np.zeros((len(EDGES[0]), len(EDGES[1]))) for _ in range(2))
    probe = BudgetGrid(0.1, 0.88, 0.495)
    for (c, s), (labels, wrong) in rows.items():
        cell = probe.cell(c, s)
        assert cell is not None
        n[cell], k[cell] = labels, wrong
    return n, k


def two_kinds() -> Prior:
    """'questions': clean at high cosine, scored or not; 'swaps': wrong half the time there."""
    qn, qk = table({(0.985, 0.6): (400, 8), (0.985, 0.2): (400, 12), (0.90, 0.3): (400, 160)})
    sn, sk = table({(0.985, 0.6): (400, 200), (0.985, 0.2): (400, 240), (0.90, 0.3): (400, 320)})
    return Prior(("questions", "swaps"), np.stack([qn, sn])[:, None], np.stack([qk, sk])[:, None])


def test_without_live_labels_the_prior_proves_nothing_it_cannot_tell_apart() -> None:
    g = BudgetGrid(0.10, floor=0.88, p_min=0.495, prior=two_kinds())
    assert g.mixture() == {"questions": 0.5, "swaps": 0.5}
    assert not g.bar().open


def test_live_labels_like_the_clean_set_open_the_shipped_point_or_stricter() -> None:
    g = BudgetGrid(0.10, floor=0.88, p_min=0.495, prior=two_kinds())
    label_many(g, 0.90, 0.3, 30, wrong=12)  # unserved candidates, 40 % wrong: like 'questions'
    assert g.mixture()["questions"] > 0.99
    bar = g.bar()
    assert bar.open and bar.serves(0.985, 0.6) and bar.prior_labels > 399
    # the prior alone never opens cells under the shipped score, however clean it says they are
    assert not bar.serves(0.985, 0.2) and not bar.serves(0.90, 0.3)
    # their own live labels do: then a cosine-only bar serves them
    label_many(g, 0.985, 0.2, OPEN_LABELS, wrong=0)
    bar = g.bar()
    assert bar.serves(0.985, 0.2) and bar.cos_only <= 0.98 and not bar.serves(0.90, 0.3)


def test_live_labels_like_the_word_swap_set_keep_it_shut() -> None:
    g = BudgetGrid(0.10, floor=0.88, p_min=0.495, prior=two_kinds())
    label_many(g, 0.90, 0.3, 30, wrong=24)  # 80 % wrong: like 'swaps'
    assert g.mixture()["swaps"] > 0.99
    assert not g.bar().open


def test_wrong_live_labels_in_the_served_region_override_the_prior_at_once() -> None:
    # One clean table only: the mixture cannot move, the live labels alone must shut it.
    qn, qk = table({(0.985, 0.6): (2000, 40)})
    g = BudgetGrid(
        0.10, floor=0.88, p_min=0.495, prior=Prior(("q",), qn[None, None], qk[None, None])
    )
    assert g.bar().serves(0.985, 0.6)
    label_many(g, 0.985, 0.6, 12, wrong=6)  # half of the audited hits were wrong
    assert not g.bar().open


def test_the_shipped_prior_was_built_with_the_shipped_verifier(tmp_path: Path) -> None:
    edges = grid_edges(0.88, 0.495)
    prior = load_prior(DEFAULT_PRIOR, DEFAULT_ARTIFACT, *edges)
    assert prior is not None, "rebuild it: python -m bench.budget_prior"
    assert set(prior.names) == {"qqp", "paws", "stsb"} and prior.labels.sum() > 1000
    assert prior.phase_labels.shape[1] == 2  # first texts, second texts
    other = tmp_path / "verifier.npz"
    other.write_bytes(DEFAULT_ARTIFACT.read_bytes() + b"retrained")
    assert load_prior(DEFAULT_PRIOR, other, *edges) is None  # another verifier: not used
    # built with the shipped rival rule: a route with the rule off (or another cosine) sees
    # the contested lookups the prior left out, so it learns from its own labels alone
    assert load_prior(DEFAULT_PRIOR, DEFAULT_ARTIFACT, *edges, RIVAL_COSINE) is not None
    assert load_prior(DEFAULT_PRIOR, DEFAULT_ARTIFACT, *edges, None) is None
    assert load_prior(DEFAULT_PRIOR, DEFAULT_ARTIFACT, *edges, 0.95) is None
    assert load_prior(tmp_path / "missing.npz", DEFAULT_ARTIFACT, *edges) is None


def test_labels_fade_so_a_route_forgets_old_traffic() -> None:
    now = [1000.0]
    g = BudgetGrid(0.10, floor=0.88, p_min=0.495, half_life=3600.0, clock=lambda: now[0])
    label_many(g, 0.985, 0.6, 150, wrong=1)
    assert g.bar().open
    now[0] += 3600.0  # one half-life later: 75 labels' worth, under min_labels
    g.observe(0.985, 0.6)
    assert g.labels.sum() == pytest.approx(75.0) and not g.bar().open
    # new traffic at the same place is wrong a third of the time: it now outweighs the old
    label_many(g, 0.985, 0.6, 60, wrong=20)
    assert not g.bar().open


def test_the_mixture_knows_a_dataset_in_either_phase() -> None:
    """A table whose first phase (new questions) is mostly wrong and second phase (repeats)
    mostly right: traffic that is all new questions so far still looks like it, not like a
    table that is wrong half the time in both phases."""
    n, _ = table({(0.90, 0.3): (100, 0)})
    cell = np.argwhere(n > 0)[0]
    phases = np.zeros((2, 2, *n.shape))  # [dataset, phase, i, j]
    wrong = np.zeros_like(phases)
    phases[0, :, cell[0], cell[1]] = 100
    wrong[0, 0, cell[0], cell[1]], wrong[0, 1, cell[0], cell[1]] = 90, 10  # questions
    phases[1, :, cell[0], cell[1]] = 100
    wrong[1, :, cell[0], cell[1]] = 50  # half wrong throughout
    prior = Prior(("questions", "other"), phases, wrong)
    live_n, live_k = np.zeros_like(n), np.zeros_like(n)
    live_n[tuple(cell)], live_k[tuple(cell)] = 40, 36  # 90 % wrong: new questions
    w = prior.mixture(live_n, live_k)
    assert w[0] > 0.99


def test_labels_below_the_shipped_floor_tell_the_traffic_but_serve_only_on_live_evidence() -> None:
    # A budgeted route scores from LEARN_FLOOR (0.88) while the shipped point is cosine 0.94:
    # a prior calling the 0.90 cells clean opens nothing there by itself.
    qn, qk = table({(0.985, 0.6): (2000, 40), (0.90, 0.6): (2000, 40)})
    prior = Prior(("q",), qn[None, None], qk[None, None])
    g = BudgetGrid(0.10, floor=0.88, p_min=0.495, prior=prior, serve_floor=0.94)
    assert 0.94 in g.cos_edges and g.cell(0.90, 0.6) is not None
    bar = g.bar()
    assert bar.serves(0.985, 0.6) and not bar.serves(0.90, 0.6)
    label_many(g, 0.90, 0.6, OPEN_LABELS, wrong=0)  # the route's own labels there
    for _ in range(100):
        g.observe(0.90, 0.6)
    assert g.bar().serves(0.90, 0.6)


def test_a_route_whose_labels_are_wrong_more_often_than_the_prior_says_discounts_the_prior() -> (
    None
):
    # The prior (development data) puts the cell at 4 % on 1,000 labels; this route's own 200
    # labels there are 9.5 % wrong: not enough to refute the region by themselves (their lower
    # bound is under 8 %), but the user's traffic is plainly harder than the prior's, and the
    # prior's rates are scaled by how much (19 wrong where it expected 8).
    qn, qk = table({(0.985, 0.6): (1000, 40)})
    prior = Prior(("q",), qn[None, None], qk[None, None])
    grids = {
        s: BudgetGrid(0.08, floor=0.88, p_min=0.495, prior=prior, shift=s) for s in (False, True)
    }
    for g in grids.values():
        label_many(g, 0.985, 0.6, 200, wrong=19)
    trusting, shifted = grids[False], grids[True]
    assert trusting.bar().serves(0.985, 0.6)  # the prior's 1,000 labels outvote the route's
    p0, k0 = prior.pseudo(shifted.labels, shifted.wrong, 1.0)
    assert shifted.harder(p0, k0) == pytest.approx((19 + 5) / (8 + 5), rel=0.02)
    assert not shifted.bar().open
    assert shifted.bar().prior_scale == pytest.approx(shifted.harder(p0, k0))
    # traffic as clean as the prior says leaves it alone
    clean = BudgetGrid(0.08, floor=0.88, p_min=0.495, prior=prior)
    label_many(clean, 0.985, 0.6, 200, wrong=8)
    assert clean.harder(*prior.pseudo(clean.labels, clean.wrong, 1.0)) == pytest.approx(1.0)
    assert clean.bar().serves(0.985, 0.6)


def test_labels_left_of_the_shipped_score_do_not_open_cells_under_its_floor() -> None:
    # Each part outside the shipped point needs its own live labels: ten clean labels over the
    # floor (left of the shipped score) say nothing of the cells under the floor.
    qn, qk = table({(0.985, 0.6): (2000, 20), (0.985, 0.45): (2000, 20), (0.90, 0.6): (2000, 20)})
    prior = Prior(("q",), qn[None, None], qk[None, None])
    g = BudgetGrid(0.10, floor=0.88, p_min=0.495, prior=prior, serve_floor=0.94)
    label_many(g, 0.985, 0.45, OPEN_LABELS, wrong=0)
    bar = g.bar()
    assert bar.serves(0.985, 0.45) and not bar.serves(0.90, 0.6)


def test_a_closed_bar_says_why_of_the_shipped_point_region() -> None:
    g = BudgetGrid(0.10, floor=0.88, p_min=0.495, min_labels=100)
    assert g.bar().reason == "too_few_labels" and math.isnan(g.bar().estimate)
    # left of the shipped score: outside the region the route starts from, whatever its error
    label_many(g, 0.905, 0.3, 200, wrong=80)
    bar = g.bar()
    assert not bar.open and bar.reason == "too_few_labels" and bar.labels == 0
    label_many(g, 0.985, 0.6, 120, wrong=12)  # 10 %: the bound is over a 0.10 budget
    bar = g.bar()
    assert not bar.open and bar.reason == "bound_over_budget"
    assert bar.labels == 120 and bar.estimate == pytest.approx(0.10) and bar.bound > 0.10
    label_many(g, 0.985, 0.6, 100, wrong=60)  # the live labels alone prove it over budget
    assert g.bar().reason == "refuted"
    label_many(g, 0.99, 0.9, 5000, wrong=0)
    assert g.bar().open and g.bar().reason == ""
