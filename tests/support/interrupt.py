"""Ctrl-C in the middle of a run: at a chosen federation round, or at the n-th call of any method."""

from __future__ import annotations

from collections.abc import Callable

import pytest


def interrupted_at_call(monkeypatch, owner: type, method: str, n: int, start: Callable[[], object]) -> KeyboardInterrupt:
    """Run `start()` with Ctrl-C arriving as `owner.method` is called the n-th time; the
    interrupt, its patch undone."""
    real, calls = getattr(owner, method), []

    def stop(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(owner, method, stop)
    with pytest.raises(KeyboardInterrupt) as stopped:
        start()
    monkeypatch.undo()
    return stopped.value


def interrupted_at_round(monkeypatch, n: int, start: Callable[[], object]) -> KeyboardInterrupt:
    """Run `start()` with Ctrl-C arriving as the n-th federation round begins (every round of
    every study goes through `Federation.run_round`); the interrupt, its patch undone."""
    from fedcare.runtime.federation import Federation

    return interrupted_at_call(monkeypatch, Federation, "run_round", n, start)
