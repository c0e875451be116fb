"""The Markert thesis's protocol (§5.3), as the server runs it.

Per seed every method starts from the same initial model (torchvision's random init drawn
from the seed, or `model.weights` in every layer but the last) and runs `train.rounds` rounds:

- **FL methods** (fedavg, fedprox, feddyn, feddg, fedrep and their "-uniform" variants): all
  clients train every round (C = 1), the server aggregates (WAVG, then AdamW). FedDG runs its
  amplitude exchange before round 1.
- **CENT**: one participant holding every client's training frames (pooled, in this process
  only); a round is one epoch.
- **LOT**: for each client k a federation in which only k trains (a round is one epoch on its
  own frames); its model is the federation's message, so every client can score it.

After every round each client scores, on its own test frames and at the client, the model it
would use: the global model (FL methods, CENT), its own body + head (FedRep), or client k's
model (LOT): one `client_eval` record per client with macro F1, per-tool precision, recall,
F1 and the tp/fp/fn counts (summed over clients they give the scores on the union of the test
sets); LOT's records say whose model it was (`model`). Per FL round, a `round` record (mean
training loss; the server's step and the clients' mean update as shares of the model's norm,
and the server's learning rate)
and one `client_update` record per client (CosSim, GradDiff:
`fedcare.studies.surgical.updates`). No round 0 is scored (the thesis's curves start at 1).

Units (`fedcare resume`): one round of one method of one seed; for LOT one round of one
client's model. A resumed run takes the running federation back from the checkpoint.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from fedcare.data.surgical.clients import TOOLS
from fedcare.runtime.federation import POOLED, Federation
from fedcare.seeding import derive_seed
from fedcare.studies.base import StudyProtocol
from fedcare.studies.surgical.config import FL_METHODS, SurgicalExperiment
from fedcare.studies.surgical.data import TEST, TRAIN
from fedcare.studies.surgical.methods import base_method, server_schedule
from fedcare.studies.surgical.updates import UpdateStatistics

METRICS = "multilabel"
THESIS_BATCH = {"alexnet": 128, "vgg13": 16}
THESIS_CENT_LR = {"alexnet": 1e-4, "vgg13": 1e-5}


@torch.no_grad()
def membership_losses(model: nn.Module, data) -> "np.ndarray":
    """Per frame, the unweighted BCE over the six tools (the attack's ranking; the training
    loss's positive weights are a client's and would rank its frames by label, not membership)."""
    import numpy as np
    from torch.nn import functional as F

    from fedcare.algorithms.training import as_float
    from fedcare.device import device_of

    was_training = model.training
    model.eval()
    losses = []
    for start in range(0, len(data), 64):
        out = model(as_float(data.x[start : start + 64].to(device_of(model)))).float().cpu()
        losses.append(F.binary_cross_entropy_with_logits(out, data.y[start : start + 64].float(), reduction="none")
                      .mean(dim=1).numpy())
    model.train(was_training)
    return np.concatenate(losses)


class SurgicalProtocol(StudyProtocol):
    config: SurgicalExperiment

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        c = self.config
        per_seed = sum(len(c.clients) if m == "lot" else 1 for m in c.methods) * c.train.rounds
        self.units_total = len(c.seeds) * per_seed
        self.audit = None
        # [privacy.audit]'s membership audit: after each federation's last round
        if c.privacy is not None and c.privacy.audit is not None and c.privacy.audit.membership:
            from fedcare.privacy.client_audit import ClientMembershipAudit

            self.audit = ClientMembershipAudit(self, c.privacy.audit)

    # -- facts and notes ---------------------------------------------------------------
    def client_sizes(self) -> dict[str, dict]:
        summaries = self.runtime.summaries()
        missing = [c for c in self.config.clients if c not in summaries]
        if missing:
            raise RuntimeError(f"clients {missing} have no site: every configured client must take part")
        return {c: dict(summaries[c]) for c in self.config.clients}

    def facts(self) -> dict:
        m = self.config.model
        return {"clients": self.client_sizes(), "rounds": self.config.train.rounds, "architecture": m.architecture,
                "frame_size": list(self.config.data.frame_size)}

    def notes(self) -> list[str]:
        """The deviations from the thesis this run makes (the report lists them)."""
        c, m, t = self.config, self.config.model, self.config.train
        notes = []
        if m.weights is None:
            notes.append("Deviation: the models start from torchvision's random initialisation (model.weights is not "
                         "set); the thesis fine-tunes ImageNet-pretrained weights, which fedcare never downloads.")
        else:
            notes.append(f"Initial weights: {m.weights} in every layer but the last (6 outputs, random).")
        if m.width != 1.0 or m.hidden != 4096:
            notes.append(f"Deviation (demo-only sizes): {m.architecture} with {m.width:g}x the channels and "
                         f"fully-connected width {m.hidden} (the thesis: 1x, 4096).")
        if tuple(c.data.frame_size) != (240, 135):
            notes.append(f"Deviation: frames of {c.data.frame_size[0]}x{c.data.frame_size[1]} (the thesis: 240x135).")
        if t.rounds != 50:
            notes.append(f"Deviation: {t.rounds} rounds / epochs (the thesis: 50).")
        if t.batch_size != THESIS_BATCH[m.architecture]:
            notes.append(f"Deviation: batch size {t.batch_size} (the thesis: {THESIS_BATCH[m.architecture]} for "
                         f"{m.architecture}).")
        if "cent" in c.methods and t.cent_lr != THESIS_CENT_LR[m.architecture]:
            notes.append(f"Deviation: CENT's maximum learning rate {t.cent_lr:g} (the thesis: "
                         f"{THESIS_CENT_LR[m.architecture]:g} for {m.architecture}).")
        schedule = server_schedule(c)
        if schedule is not None:
            notes.append(f"Deviation: the FL server's AdamW rate is held at {t.server_lr:g} for {schedule.hold} rounds, "
                         f"then cosine-annealed to 0 by round {t.rounds} (train.server_anneal; the thesis keeps it "
                         f"constant).")
        if t.pos_weight != "client":
            notes.append(f"BCE positive weights: {t.pos_weight} (default: each client's own training labels).")
        return notes

    # -- models --------------------------------------------------------------------------
    def initial_state(self, seed: int) -> dict[str, torch.Tensor]:
        """The seed's initial model: random init from the run's derived seed (leaving torch's
        global generator as it was), then `model.weights` if set."""
        with torch.random.fork_rng():
            torch.manual_seed(derive_seed(seed, "init"))
            model = self.study.composed.new_model()
        self.study.load_weights(model)
        return model.state_dict()

    def model_from(self, state: dict[str, torch.Tensor]) -> nn.Module:
        model = self.study.composed.new_model()
        model.load_state_dict(state)
        return model

    # -- the protocol -------------------------------------------------------------------
    def run(self) -> None:
        clients = list(self.client_sizes())
        if self.units_done == 0:
            self.record("clients", clients=self.client_sizes(), tools=list(TOOLS))
        for seed in self.config.seeds:
            initial: dict[str, torch.Tensor] | None = None
            for method in self.config.methods:
                runs = [(k, {k: TRAIN}) for k in clients] if method == "lot" else [(None, None)]
                for owner, train in runs:
                    key = (seed, method) if owner is None else (seed, method, owner)
                    if all(self.finished(*key, r) for r in range(1, self.config.train.rounds + 1)):
                        continue
                    if initial is None:
                        initial = self.initial_state(seed)
                    if method == "cent":
                        train = {POOLED: self.runtime.pool({c: TRAIN for c in clients})}
                    elif train is None:
                        train = {c: TRAIN for c in clients}
                    units = [(*key, r) for r in range(1, self.config.train.rounds + 1)]
                    point = {} if owner is None else {"model": owner}
                    self.stop_if_diverged(seed, method, units, functools.partial(
                        self.run_rounds, method, seed, initial, train, clients, key, owner), **point)

    def run_rounds(self, method: str, seed: int, initial: dict, train: dict, clients: list[str], key: tuple,
                   owner: str | None) -> None:
        rounds = self.config.train.rounds
        done = [r for r in range(1, rounds + 1) if self.finished(*key, r)]
        point = {} if owner is None else {"model": owner}
        label = {"method": method, "seed": seed, **point}
        federation: Federation = self.runtime.federation(self.model_from(initial), method, seed, label=label)
        stats = None
        if base_method(method)[0] in FL_METHODS:
            stats = UpdateStatistics()
            federation.observers.append(stats)
        if done:
            federation.load_state_dict(self.checkpoint.state("federation"))
        elif base_method(method)[0] == "feddg":
            federation.run_setup("setup", train)
        what = f"seed {seed}: {method}" + (f" ({owner}'s model)" if owner else "")
        for rnd in range(len(done) + 1, rounds + 1):
            info = federation.run_round("train", rnd, train)
            server = {} if stats is None else {**stats.server, "server_lr": self.server_rate(rnd)}
            self.record("round", method=method, seed=seed, phase="train", round=rnd, **point, **info, **server)
            if stats is not None:
                for client, s in sorted(stats.last.items()):
                    self.record("client_update", method=method, seed=seed, round=rnd, client=client, **s)
            self.evaluate_clients(federation, {c: TEST for c in clients}, METRICS, method=method, seed=seed,
                                  round=rnd, **point)
            if rnd == rounds and self.audit is not None and owner is None and method != "cent":
                self.audit.run(federation, clients, method, seed, self.membership_sets, membership_losses)
            self.finish_unit(f"{what} round {rnd}", *key, rnd,
                             federation=federation.state_dict if rnd < rounds else None)

    def server_rate(self, rnd: int) -> float:
        """The FL server's AdamW learning rate at round `rnd` (its step `rnd`)."""
        schedule = server_schedule(self.config)
        return self.config.train.server_lr * (1.0 if schedule is None else schedule(rnd))

    def membership_sets(self, client: str):
        """[privacy.audit]'s members (the client's training frames) and non-members (its test
        frames: other videos, see docs/privacy.md on what that measures)."""
        site = self.runtime.sites[client]
        return site.data(TRAIN), site.data(TEST)
