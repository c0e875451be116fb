"""FedPer: each client's head stays private and carries over to its next round; the body is averaged."""

import pytest
import torch

from fedcare.algorithms.fedper import fedper
from fedcare.algorithms.training import TrainSettings
from fedcare.runtime.federation import Federation

from support.tiny import fit_once, record_fits, tiny_data, tiny_model


SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)


def test_fedper_heads_stay_private_and_persist_across_rounds():
    data = {1: tiny_data(1), 2: tiny_data(2, n=24)}
    federation = Federation(tiny_model(), fedper(SETTINGS), seed=0)
    initial_head = {k: v.clone() for k, v in federation.state_of(1).items()}
    calls = record_fits(federation)
    federation.run_round("p", 1, data)
    after_one = {c: {k: v.clone() for k, v in federation.states[c].items()} for c in (1, 2)}
    assert set(after_one[1]) == {k for k in federation.model.state_dict() if k.startswith("classifier.")}
    assert not any(k.startswith("classifier.") for k in federation.global_message.tensors)
    assert any(not torch.equal(after_one[1][k], after_one[2][k]) for k in after_one[1])  # personal heads
    assert any(not torch.equal(after_one[1][k], initial_head[k]) for k in initial_head)  # the head trained

    # the global body is the example-weighted average of the bodies sent
    replies = {c: r for c, rnd, _, _, r, _ in calls if rnd == 1}
    w = federation.global_message.tensors["features.0.weight"]
    expected = (40 * replies[1].tensors["features.0.weight"].double() + 24 * replies[2].tensors["features.0.weight"].double()) / 64
    assert torch.allclose(w.double(), expected, atol=1e-7)

    federation.run_round("p", 2, data)
    for c in (1, 2):  # round 2 started from this client's own round-1 head
        (_, _, message, state, _, _), = [call for call in calls if call[0] == c and call[1] == 2]
        assert set(state) == set(after_one[c])
        assert all(torch.equal(state[k], after_one[c][k]) for k in state)
        assert not any(k.startswith("classifier.") for k in message.tensors)
    personal = federation.personal_model(1).state_dict()
    assert all(torch.equal(personal[k], federation.states[1][k]) for k in federation.states[1])


def test_fedper_rejects_a_head_path_the_model_lacks():
    with pytest.raises(ValueError, match="not modules"):
        fit_once(fedper(SETTINGS, head_paths=("head",)))
    with pytest.raises(ValueError):
        fedper(SETTINGS, head_paths=())
