"""benchmarks/pain_profile.py's accounting, which the README's profile of the pain protocol
reads: each phase's time counted once (a phase called from another pauses its caller). Its
timings themselves are the benchmark's, not tested here."""

import importlib.util

from support import ROOT


_spec = importlib.util.spec_from_file_location("pain_profile", ROOT / "benchmarks" / "pain_profile.py")
profile = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(profile)


def test_a_phase_called_from_another_is_counted_once(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(profile.time, "perf_counter", lambda: now[0])
    clock = profile.PhaseClock()

    def cut(n):  # "variants": 3 s per call
        now[0] += 3.0
        return n

    timed_cut = clock.wrap("variants", cut, count=lambda args, kwargs, result: result)

    def step():  # "training": 1 s, a cut of 32 images, 2 s more
        now[0] += 1.0
        timed_cut(32)
        now[0] += 2.0

    timed_step = clock.wrap("training", step)
    timed_step()
    timed_step()
    assert clock.seconds["training"] == 6.0  # 2 x (1 + 2): the cuts' 3 s are not training's
    assert clock.seconds["variants"] == 6.0
    assert clock.items["variants"] == 64
    assert not clock.stack


def test_a_phase_that_raises_still_counts_and_returns_the_time_to_its_caller(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(profile.time, "perf_counter", lambda: now[0])
    clock = profile.PhaseClock()

    def fail():
        now[0] += 2.0
        raise ValueError("bad frame")

    timed_fail = clock.wrap("decode", fail)

    def outer():
        now[0] += 1.0
        try:
            timed_fail()
        except ValueError:
            pass
        now[0] += 1.0

    clock.wrap("evaluation", outer)()
    assert clock.seconds == {"evaluation": 2.0, "decode": 2.0}

