"""ckptinspect._parallel.ordered_map: order, bounded look-ahead, errors at their position."""

import threading
import time

import numpy as np
import pytest

from ckptinspect._parallel import ordered_map
from pool_spy import count_pools  # noqa: E402 - tests/helpers is on sys.path


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_results_come_in_input_order(workers):
    # Later items finish first (shorter sleeps), the output order must not follow.
    out = list(ordered_map(lambda i: (time.sleep(0.002 * (10 - i)), i)[1], range(10), workers=workers))
    assert out == list(range(10))


def test_work_runs_in_several_threads():
    names = set()
    barrier = threading.Barrier(2, timeout=5)

    def fn(i):
        names.add(threading.current_thread().name)
        barrier.wait()  # both workers must be inside fn at once, or this times out
        return i

    assert list(ordered_map(fn, range(4), workers=2, ahead=2)) == [0, 1, 2, 3]
    assert len(names) == 2


def test_at_most_ahead_items_are_drawn_before_the_first_result():
    drawn = []

    def items():
        for i in range(100):
            drawn.append(i)
            yield i

    gen = ordered_map(lambda i: i * 2, items(), workers=2, ahead=3)
    assert next(gen) == 0
    assert len(drawn) <= 3
    gen.close()


def test_an_error_is_raised_at_its_position_after_the_earlier_results():
    def fn(i):
        if i == 3:
            raise ValueError("item 3")
        return i

    seen = []
    with pytest.raises(ValueError, match="item 3"):
        for r in ordered_map(fn, range(8), workers=2):
            seen.append(r)
    assert seen == [0, 1, 2]


def test_closing_early_stops_drawing_and_joins_the_threads():
    before = threading.active_count()
    drawn = []

    def items():
        for i in range(1000):
            drawn.append(i)
            yield i

    for r in ordered_map(lambda i: i, items(), workers=2, ahead=4):
        if r == 5:
            break
    assert len(drawn) < 20
    assert threading.active_count() == before


def test_float_sums_merged_in_order_give_the_same_bits_with_any_worker_count():
    rng = np.random.default_rng(0)
    blocks = [rng.standard_normal(50_000).astype(np.float32) for _ in range(16)]

    def total(workers):
        s = 0.0
        for part in ordered_map(lambda b: float(np.dot(b.astype(np.float64), b.astype(np.float64))), blocks, workers=workers):
            s += part
        return s

    assert total(1) == total(2) == total(3)


@pytest.mark.parametrize("workers", [1, 2])
def test_inline_items_are_computed_in_the_calling_thread_in_order(workers):
    """Items the ``inline`` predicate is true of (here the even ones) are computed by the calling
    thread, the others by the pool's threads; the results still come in input order."""
    where = {}

    def fn(i):
        where[i] = threading.current_thread().name
        time.sleep(0.001 * (i % 3))
        return i * 10

    out = list(ordered_map(fn, range(12), workers=workers, inline=lambda i: i % 2 == 0))
    assert out == [i * 10 for i in range(12)]
    me = threading.current_thread().name
    assert all(where[i] == me for i in range(0, 12, 2))
    if workers > 1:
        assert all(where[i] != me and where[i].startswith("ckptinspect") for i in range(1, 12, 2))


def test_no_pool_is_started_when_every_item_is_inline(monkeypatch):
    started = count_pools(monkeypatch)
    assert list(ordered_map(lambda i: i + 1, range(5), workers=2, inline=lambda i: True)) == [1, 2, 3, 4, 5]
    assert started == []
    assert list(ordered_map(lambda i: i + 1, range(5), workers=2, inline=lambda i: i == 3)) == [1, 2, 3, 4, 5]
    assert started == [(2,)]


def test_an_inline_error_is_raised_at_its_position_and_the_threads_are_joined():
    before = threading.active_count()

    def fn(i):
        if i == 4:
            raise ValueError("item 4")
        return i

    seen = []
    with pytest.raises(ValueError, match="item 4"):
        for r in ordered_map(fn, range(10), workers=2, ahead=4, inline=lambda i: i % 4 == 0):
            seen.append(r)
    assert seen == [0, 1, 2, 3]
    assert threading.active_count() == before
