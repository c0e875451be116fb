"""Every method for a few rounds; after each round every client verifies identities with its
own model on its own test half (TAR@FAR computed at the client from the embeddings). A unit
is one round of one method of one seed: `fedcare resume` continues after the last one."""

from __future__ import annotations

import torch

from fedcare.runtime.refs import Split
from fedcare.studies.base import StudyProtocol


class ToyProtocol(StudyProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.units_total = len(self.config.seeds) * len(self.config.methods) * self.config.rounds

    def run(self) -> None:
        clients = sorted(self.runtime.summaries())
        for seed in self.config.seeds:
            torch.manual_seed(seed)
            initial = self.study.composed.new_model().state_dict()
            for method in self.config.methods:
                done = [r for r in range(1, self.config.rounds + 1) if self.finished(seed, method, r)]
                if len(done) == self.config.rounds:
                    continue
                model = self.study.composed.new_model()
                model.load_state_dict(initial)
                federation = self.runtime.federation(model, method, seed, label={"method": method, "seed": seed})
                if done:
                    federation.load_state_dict(self.checkpoint.state("federation"))
                for rnd in range(len(done) + 1, self.config.rounds + 1):
                    info = federation.run_round("train", rnd, {c: Split("train") for c in clients})
                    self.record("round", method=method, seed=seed, phase="train", round=rnd, **info)
                    self.evaluate_clients(federation, {c: Split("test") for c in clients}, "verification", method=method,
                                          seed=seed, round=rnd)
                    self.finish_unit(f"seed {seed}: {method} round {rnd}", seed, method, rnd,
                                     federation=federation.state_dict if rnd < self.config.rounds else None)
