"""Before the first unit trains (fedcare.studies.checks): every method builds with its stack,
the runtime builds through the stack, and the model's outputs fit the task; each mistake stops
the run before any method has trained, naming what is wrong."""

from __future__ import annotations

import pytest
import torch

from fedcare.studies.checks import ModelOutputMismatch
from fedcare.studies.load import load_config
from fedcare.studies.run import run_study, stop_note
from fedcare.tasks import BINARY, MULTICLASS, MultilabelTask
from support.planted_study import plant, toy_experiment

WATCHED = '''
    import torch
    from support.toy_study import ToyStudy
    from support.toy_study.protocol import ToyProtocol

    EVENTS = []  # what ran: the data read, the protocol started
    DRAWS = []  # the global generator's first draw in each protocol


    class Watched(ToyProtocol):
        def run(self):
            EVENTS.append("protocol")
            DRAWS.append(torch.rand(1).item())
            super().run()


    class Base(ToyStudy):
        protocol_class = Watched

        def local_runtime(self, workdir, progress):
            EVENTS.append("data")
            return super().local_runtime(workdir, progress)
'''


def run_planted(tmp_path, monkeypatch, study: str, methods: str = '["fedavg", "local"]'):
    plant(tmp_path, monkeypatch, WATCHED + study + "\n    STUDY = Planted\n")
    config = load_config(toy_experiment(tmp_path / "toy.toml", methods))
    with pytest.raises(Exception) as stopped:
        run_study(config, tmp_path / "run")
    import planted

    assert not (tmp_path / "run").exists() and stop_note(stopped.value) == "nothing was finished; nothing kept"
    return stopped.value, planted.EVENTS


def test_a_method_missing_from_the_catalogue_stops_the_run_before_the_data_are_read(tmp_path, monkeypatch):
    error, events = run_planted(tmp_path, monkeypatch, '''
    class Planted(Base):
        def algorithm(self, name):
            from fedcare.algorithms.catalogue import build

            return build("locall", super().algorithm("fedavg").client.settings) if name == "local" else super().algorithm(name)
''')
    assert "unknown algorithm 'locall'" in str(error) and any("while building 'local'" in n for n in error.__notes__)
    assert events == []  # fedavg, the first method, never trained; not even the data were read


def test_a_model_whose_outputs_do_not_fit_the_task_stops_the_run_before_training(tmp_path, monkeypatch):
    error, events = run_planted(tmp_path, monkeypatch, '''
    from torch import nn


    class Planted(Base):
        def new_model(self):
            return nn.Sequential(super().new_model().body, nn.Unflatten(1, (4, 1)))  # (examples, 4, 1)
''')
    assert isinstance(error, ModelOutputMismatch)
    assert str(error) == ("the toy study's model (Sequential) does not fit its embedding task: the task needs "
                          "(examples, dimensions) embeddings for 4 examples, but the outputs are (4, 4, 1) (on 4 "
                          "examples of 'split/train')")
    assert events == ["data"]  # the data were read (the check runs on some), the protocol never started


def test_a_runtime_handed_the_study_s_own_algorithms_is_refused(tmp_path, monkeypatch):
    error, events = run_planted(tmp_path, monkeypatch, '''
    class Planted(Base):
        def local_runtime(self, workdir, progress):
            runtime = super().local_runtime(workdir, progress)
            runtime.algorithm = self.algorithm  # as studies did before the stack was composed in one place
            return runtime
''')
    assert isinstance(error, RuntimeError) and "pass self.composed.algorithm" in str(error)
    assert events == ["data"]


def test_the_check_leaves_the_numbers_as_they_were(tmp_path, monkeypatch):
    """The check builds a model (drawing initial weights from torch's global generator) and
    reads data: the protocol finds the generator, and the records, as without it."""
    plant(tmp_path, monkeypatch, WATCHED + "\n    STUDY = Base\n")
    config = load_config(toy_experiment(tmp_path / "toy.toml"))
    torch.manual_seed(0)
    checked = run_study(config, tmp_path / "checked")
    monkeypatch.setattr("fedcare.studies.run.check_before_training", lambda study, runtime: None)
    torch.manual_seed(0)
    unchecked = run_study(config, tmp_path / "unchecked")
    import planted

    assert len(planted.DRAWS) == 2 and planted.DRAWS[0] == planted.DRAWS[1]
    assert (checked / "metrics.jsonl").read_bytes() == (unchecked / "metrics.jsonl").read_bytes()


@pytest.mark.parametrize("task, labels, wrong, problem, right", [
    (BINARY, torch.zeros(9), torch.zeros(9, 1),
     "one logit per example, shaped as the labels (9,), but the outputs are (9, 1)", torch.zeros(9)),
    (MULTICLASS, torch.tensor([0, 5, 1]), torch.zeros(3, 4), "4 logits per example, but a label is 5", torch.zeros(3, 6)),
    (MultilabelTask(labels=("a", "b")), torch.zeros(2, 3), torch.zeros(2, 3), "2 labels (a, b), but 3 logits per example",
     None),
])
def test_each_task_says_why_outputs_do_not_fit(task, labels, wrong, problem, right):
    assert task.output_problem(wrong, labels) == problem
    if right is not None:
        assert task.output_problem(right, labels) is None
