"""The session protocol (thesis §6.2.3), SessionBalancing and the Group-1 pretraining set."""

import numpy as np
import pytest
import torch

from fedcare.data.transforms import precrop_size
from fedcare.runtime.federation import Federation, PhaseResult
from fedcare.runtime.local import LocalRuntime
from fedcare.studies.pain.cohort import PainCohort, PainDataError, PainSite, Session, balance, pretraining_sets
from fedcare.studies.pain.config import PainExperiment
from fedcare.studies.pain.study import PainStudy


def _session(value: int, labels: list[int], size: int = 32) -> Session:
    """Every pixel of the session's frames holds `value` (and so does every variant: the crop
    leaves a 10° rotation no fill at 32 px; at 16 px the fill bleeds in), so a training item
    tells its session."""
    n = len(labels)
    return Session(np.full((n, precrop_size(size), precrop_size(size)), value, np.uint8), np.ones(n, np.int8),
                   np.array(labels, np.uint8), np.array(labels, np.float32), size)


def test_balance_draws_per_class_items_from_the_newest_sessions_first():
    sessions = [_session(0, [1] * 30 + [0] * 30), _session(1, [1] * 10 + [0] * 90), _session(2, [0] * 5)]
    data = balance(sessions, upto=1, per_class=20, rng=np.random.default_rng(0))
    assert len(data) == 40 and data.y.sum().item() == 20
    # session 1 alone has 40 positive items and 360 negative items (x4 variants): enough, so
    # session 0 is never touched and session 2 (after `upto`) never either
    assert set(data.x[:].unique().tolist()) == {1}


def test_balance_walks_back_and_tops_up_with_replacement():
    sessions = [_session(0, [1] * 2 + [0] * 50), _session(1, [1] * 1 + [0] * 50)]
    data = balance(sessions, upto=1, per_class=200, rng=np.random.default_rng(0))
    assert len(data) == 400 and data.y.sum().item() == 200
    positives = data.x[data.y == 1]  # a boolean index, as on a tensor
    assert set(positives.unique().tolist()) == {0, 1}  # both sessions' 12 positive items, re-drawn


def test_balance_excludes_a_subject_without_both_classes():
    assert balance([_session(0, [0] * 10)], upto=0, per_class=5, rng=np.random.default_rng(0)) is None


def _frames_session(first_id: int, labels: list[int], size: int = 32) -> Session:
    """Each frame (and so each of its 4 variants) holds the frame's own id as pixel value."""
    ids = np.arange(first_id, first_id + len(labels), dtype=np.uint8)
    side = precrop_size(size)
    frames = np.broadcast_to(ids[:, None, None], (len(labels), side, side)).copy()
    return Session(frames, np.ones(len(labels), np.int8), np.array(labels, np.uint8), np.array(labels, np.float32), size)


def test_pretraining_set_keeps_every_positive_and_as_many_negatives_split_by_frame():
    cohort = PainCohort({42: [_frames_session(1, [1, 0, 0, 0, 1]), _frames_session(6, [0] * 6)],
                         47: [_frames_session(12, [0, 1, 0])]}, 4, True)
    train, val = pretraining_sets(cohort, [42, 47], 0.3, np.random.default_rng(1))
    ys = torch.cat([d.y for d in [*train.values(), *val.values()]])
    assert ys.sum().item() == 3 * 4  # all 3 positive frames, each in 4 variants
    assert len(ys) == 2 * 12  # and as many negative items
    assert val  # some frames were held out
    # a frame's variants never straddle train and validation
    train_frames = set(torch.cat([d.x[:] for d in train.values()]).unique().tolist())
    val_frames = set(torch.cat([d.x[:] for d in val.values()]).unique().tolist())
    assert train_frames and not train_frames & val_frames


def test_pretraining_set_needs_both_classes():
    cohort = PainCohort({42: [_session(0, [0, 0])]}, 8, True)
    with pytest.raises(PainDataError, match="lack pain"):
        pretraining_sets(cohort, [42], 0.2, np.random.default_rng(0))


class _Recorder:
    """Stands in for `Federation.train_phase`: records which sessions each subject's data
    references resolve to at its site."""

    def __init__(self):
        self.phases = []
        self.runtime = None

    def sessions(self, refs):
        return {k: set(self.runtime.sites[k].data(ref).x[:].unique().tolist()) for k, ref in refs.items()}

    def __call__(self, phase, train, val, **kwargs):  # patched onto the class: not bound
        self.phases.append((phase, self.sessions(train), self.sessions(val)))
        return PhaseResult(rounds=1, best_round=1, best_val_loss=0.0)


def test_session_s_is_tested_then_validates_training_on_the_sessions_before_it(monkeypatch):
    # subject 1 has sessions 0..3, subject 2 sessions 0..1; pixel value = session index
    cohort = PainCohort(
        {1: [_session(s, [1, 0, 0, 1]) for s in range(4)], 2: [_session(s, [0, 1]) for s in range(2)]}, 32, True
    )
    config = PainExperiment.model_validate({
        "methods": ["F(N)"], "seeds": [1], "data": {"synthetic": {}},
        "protocol": {"subjects": [1, 2], "pretrain_subjects": [1], "image_size": 32, "balance_per_class": 4},
    })
    records = []
    recorder = _Recorder()
    monkeypatch.setattr(Federation, "train_phase", recorder)
    study = PainStudy(config)
    sites = {k: PainSite(k, cohort.sessions[k], 4, True) for k in (1, 2)}
    recorder.runtime = LocalRuntime(sites, study.algorithm, synthetic=True, local_data=cohort)
    protocol = study.protocol(recorder.runtime, records.append, None)
    protocol.run()
    assert protocol.test_sessions == [1, 2, 3]
    # after testing session s, train on sessions <= s-1 and validate on session s; nothing after the last
    assert [p[0] for p in recorder.phases] == ["session-1", "session-2"]
    _, train1, val1 = recorder.phases[0]
    assert train1 == {1: {0}, 2: {0}} and val1 == {1: {1}, 2: {1}}
    _, train2, val2 = recorder.phases[1]
    assert train2[1] <= {0, 1} and train2[2] <= {0, 1} and val2 == {1: {2}}  # subject 2 has no session 2
    tests = [(r["session"], r["client"]) for r in records if r["type"] == "client_eval"]
    assert tests == [(1, 1), (1, 2), (2, 1), (3, 1)]
