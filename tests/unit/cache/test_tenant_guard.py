"""TenantGuard: a tenant whose own labels refute its route's bar is served nothing semantic."""

from __future__ import annotations

from cache.semantic.budget import Bar, BudgetGrid
from cache.semantic.tenant_guard import REASON_TENANT, TenantGuard

FLOOR, SHIPPED, P_MIN = 0.88, 0.93, 0.50  # a budgeted route scores from 0.88 (LEARN_FLOOR)
OPEN = Bar(0.93, 0.50, True, 0.05, 0.08, 40, cos_only=0.98)


def guard(budget: float = 0.10, half_life: float | None = None, **kw: object) -> TenantGuard:
    now = [0.0]
    grid = BudgetGrid(
        budget,
        FLOOR,
        P_MIN,
        delta=0.20,
        half_life=half_life,
        clock=lambda: now[0],
        serve_floor=SHIPPED,
    )
    g = TenantGuard(grid, clock=lambda: now[0], **kw)  # type: ignore[arg-type]
    g.now = now  # type: ignore[attr-defined]
    return g


def test_a_tenant_whose_labels_refute_the_bar_is_closed_and_the_others_are_not() -> None:
    g = guard()
    for _ in range(3):
        g.label("bad", 0.95, 0.6, agree=False)
        g.label("good", 0.95, 0.6, agree=True)
    shut = g.bar("bad", OPEN)
    assert not shut.open and shut.reason == REASON_TENANT and shut.labels == 3
    assert g.bar("good", OPEN) is OPEN
    assert g.bar("unknown", OPEN) is OPEN  # no labels: the route's bar
    assert g.closed_count(OPEN) == 1
    assert [v.tenant for v in g.guarded(OPEN)] == ["bad"]


def test_one_wrong_label_among_many_right_does_not_close() -> None:
    g = guard()
    g.label("t", 0.95, 0.6, agree=False)
    for _ in range(20):
        g.label("t", 0.95, 0.6, agree=True)
    assert g.bar("t", OPEN) is OPEN


def test_only_labels_in_the_served_region_count() -> None:
    g = guard()
    for _ in range(10):  # under the bar's cosine, and over it left of its score (not cos-only)
        g.label("t", 0.91, 0.9, agree=False)
        g.label("t", 0.95, 0.2, agree=False)
    assert g.bar("t", OPEN) is OPEN
    for _ in range(3):  # the cosine-only part is served: its labels count
        g.label("t", 0.985, 0.1, agree=False)
    assert not g.bar("t", OPEN).open


def test_agreeing_labels_reopen_a_closed_tenant() -> None:
    g = guard()
    for _ in range(3):
        g.label("t", 0.95, 0.6, agree=False)
    assert not g.bar("t", OPEN).open
    for _ in range(40):  # its candidates, labelled by the misses that follow, agree now
        g.label("t", 0.95, 0.6, agree=True)
    assert g.bar("t", OPEN) is OPEN
    assert g.closed_count(OPEN) == 0


def test_a_closed_route_bar_stays_closed_and_a_new_bar_is_judged_afresh() -> None:
    g = guard()
    for _ in range(3):
        g.label("t", 0.95, 0.6, agree=False)
    closed = Bar(1.01, 1.01, False, 0.5, 0.9, 3, reason="refuted")
    assert g.bar("t", closed) is closed
    stricter = Bar(0.99, 0.50, True, 0.01, 0.05, 40)  # serves none of the wrong cells
    assert g.bar("t", stricter) is stricter


def test_labels_fade_with_the_routes_half_life() -> None:
    g = guard(half_life=3600.0)
    for _ in range(3):
        g.label("t", 0.95, 0.6, agree=False)
    assert not g.bar("t", OPEN).open
    g.now[0] += 10 * 3600.0  # type: ignore[attr-defined]
    g.label("t", 0.95, 0.6, agree=True)
    assert g.bar("t", OPEN) is OPEN  # three wrong labels a thousandth of their weight


def test_the_least_recently_labelled_tenants_are_forgotten_past_the_cap() -> None:
    g = guard(max_tenants=2)
    for t in ("a", "b", "c"):
        for _ in range(3):
            g.label(t, 0.95, 0.6, agree=False)
        g.bar(t, OPEN)
    assert len(g) == 2
    assert g.bar("a", OPEN) is OPEN  # forgotten
    assert not g.bar("c", OPEN).open
    assert g.closed_count(OPEN) == 2  # b and c


def test_while_the_route_is_closed_a_tenant_is_judged_on_the_region_it_starts_from() -> None:
    """(0.93, 0.50) is the shipped point: a tenant refuted there is kept apart before the
    route serves anything, so its labels cannot keep the route shut for the others."""
    g = guard()
    closed = Bar(1.01, 1.01, False, float("nan"), 1.0, 0, reason="too_few_labels")
    for _ in range(3):
        g.label("under", 0.91, 0.9, agree=False)  # under the shipped floor: not judged there
        g.label("inside", 0.95, 0.6, agree=False)
    assert not g.refuted("under", closed)
    assert g.refuted("inside", closed)
    assert g.bar("inside", closed) is closed  # (nothing is served anyway)
    assert [v.tenant for v in g.guarded(closed)] == ["inside"]


def test_the_count_of_guarded_tenants_follows_the_routes_bar() -> None:
    """/metrics counts at each scrape under the bar then served: a stricter bar that serves
    none of a tenant's wrong cells un-guards it, and the bar coming back guards it again,
    without the tenant asking or being labelled in between."""
    g = guard()
    for _ in range(3):
        g.label("t", 0.95, 0.6, agree=False)
    stricter = Bar(0.99, 0.50, True, 0.01, 0.05, 40)
    assert g.closed_count(OPEN) == 1
    assert g.closed_count(stricter) == 0
    assert g.closed_count(OPEN) == 1
    assert len(g.guarded(OPEN)) == g.closed_count(OPEN)
