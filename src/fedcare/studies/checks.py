"""What the run sequence checks before the first unit trains, so that a mistake stops a run
before any method has spent its time (`fedcare.studies.run`):

- `check_methods(study)`, before any data are read: every algorithm the experiment's methods
  use resolves, and the stack (attack, robust rule, privacy, precision: `Study.composed`)
  composes around it. A method the study cannot build, or a protection that cannot cover it,
  stops the run naming it.
- `check_before_training(study, runtime)`, once the runtime holds the clients: the methods
  again (a study whose algorithms need the data, such as the surgical study's positive
  weights, is checked here), the runtime builds through the stack, and the study's model
  gives outputs that fit its task on a few examples of one client (`Study.sample_ref`).

A model whose outputs do not fit the task is the study's code, not the user's input: the
error is a bug, with its traceback, raised before training instead of in the first step.
"""

from __future__ import annotations

import torch

from fedcare.algorithms.training import as_float
from fedcare.device import device_of
from fedcare.studies.base import Study, StudyRuntime

EXAMPLES = 4  # how many examples the model check runs


class ModelOutputMismatch(RuntimeError):
    """A study's model gives outputs its task cannot score (a bug in the study's code)."""


def check_methods(study: Study) -> None:
    """Build every algorithm the experiment's methods use, with its stack."""
    for name in study.algorithm_names():
        try:
            study.composed.algorithm(name)
        except Exception as e:
            e.add_note(f"while building {name!r} of the {study.name} study before the run (its methods: "
                       f"{', '.join(study.config.methods)})")
            raise


def check_before_training(study: Study, runtime: StudyRuntime) -> None:
    """Before the first unit: the methods and their stack, the runtime's wiring, the model's outputs."""
    check_methods(study)
    if getattr(runtime, "algorithm", None) == study.algorithm:  # a bound method equals its twin
        raise RuntimeError(f"{type(study).__name__}.local_runtime hands the runtime the study's own algorithm(), "
                           f"so [privacy] and [robustness] would not apply: pass self.composed.algorithm")
    check_model_outputs(study, runtime)


def check_model_outputs(study: Study, runtime: StudyRuntime) -> None:
    """The study's model on a few examples of the first client that has some: its outputs fit
    the task of the experiment's first algorithm. Runs in this process only (on Flower the
    data stay at the sites), in inference mode, and leaves torch's random state as it was."""
    sites = getattr(runtime, "sites", None)
    ref, names = study.sample_ref(), study.algorithm_names()
    if not sites or ref is None or not names:
        return
    data = next((d for c in sorted(sites) if len(d := sites[c].data(ref))), None)
    if data is None:
        return
    task = study.composed.algorithm(names[0]).client.settings.task
    with torch.random.fork_rng(devices=[]):  # building a model draws its initial weights
        model = study.composed.new_model()
        model.eval()
        x, y = as_float(data.x[:EXAMPLES].to(device_of(model))), data.y[:EXAMPLES]
        try:
            with torch.no_grad():
                outputs = model(x).float().cpu()
                problem = task.output_problem(outputs, y)
                if problem is None:
                    task.evaluation_loss(outputs, y)
        except Exception as e:
            e.add_note(f"raised by the check before training: {type(model).__name__} on {len(y)} examples of '{ref}'")
            raise
    if problem is not None:
        raise ModelOutputMismatch(f"the {study.name} study's model ({type(model).__name__}) does not fit its "
                                  f"{task.name} task: the task needs {problem} (on {len(y)} examples of '{ref}')")
