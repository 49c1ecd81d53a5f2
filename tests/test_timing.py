"""moe_course.analysis.timing: calls timed in turn, warmed up once, one time per round."""

import time

from moe_course.analysis.timing import best_ms, rounds_ms


def _recorder(order: list, name: str):
    def call():
        order.append(name)
        return None
    return call


def test_rounds_ms_alternates_after_one_warm_up():
    order: list = []
    times = rounds_ms({"ours": (_recorder(order, "ours"), ()), "peer": (_recorder(order, "peer"), ())},
                      repeats=2, rounds=3)
    assert order == ["ours", "peer"] + ["ours", "ours", "peer", "peer"] * 3
    assert {name: len(ms) for name, ms in times.items()} == {"ours": 3, "peer": 3}
    assert all(ms >= 0 for values in times.values() for ms in values)


def test_best_ms_is_the_fastest_round():
    delays = iter([0.0, 0.2, 0.01, 0.15])  # warm-up, then three rounds: the second round is the fastest

    def call():
        time.sleep(next(delays))
    best = best_ms({"f": (call, ())}, repeats=1, rounds=3)["f"]
    assert 10 <= best < 100
