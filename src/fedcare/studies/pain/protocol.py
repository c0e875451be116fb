"""The pain study's protocol (Tobis thesis §6.2.3, PFDL paper Fig. 4), as the server runs it.

Per seed: pretrain on Group 1 (centrally and/or federatedly, as the methods need), then for
each method walk the sessions: test every subject's own model on session s, train on the
balanced sessions before s with session s as validation (early stopping, restore best), and
move on. The protocol sees each subject's `PainSite.summary()` and addresses data by
reference; the runtime's clients hold the frames.
"""

from __future__ import annotations

from fedcare.models.pain_cnn import PainCNN, glorot_init
from fedcare.runtime.federation import Federation, PhaseResult
from fedcare.seeding import numpy_rng, torch_generator
from fedcare.studies.base import StudyProtocol
from fedcare.studies.pain.cohort import SessionFrames, TrainingSet, pretraining_sets
from fedcare.studies.pain.methods import Method


class PainProtocol(StudyProtocol):
    """Units: each pretraining of a seed, and each test session of a method of a seed (the
    test, then the training that follows it)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.summaries = self.runtime.summaries()
        present = max(self.summaries[k]["sessions"] for k in self.subjects()) - 1
        self.last_session = min(present, self.config.protocol.last_session or present)
        self.test_sessions = list(range(1, self.last_session + 1))
        self.methods = [Method.parse(m) for m in self.config.methods]
        self.inits_needed = sorted({m.init for m in self.methods} - {"N"})
        # seed -> its methods, in run order: `seeds` first, then RANDOM alone on its other `random_seeds`
        c = self.config
        extra = [s for s in c.random_seeds or [] if s not in c.seeds] if "RANDOM" in c.methods else []
        self.plan: dict[int, list[Method]] = {}
        for seed in [*c.seeds, *extra]:
            methods = [m for m in self.methods if seed in c.seeds_of(m.label)]
            if methods:  # a seed of `seeds` has none when RANDOM is the only method and not on it
                self.plan[seed] = methods
        self.units_total = sum(len(self.inits_at(seed)) + len(methods) * len(self.test_sessions)
                               for seed, methods in self.plan.items())
        privacy = self.config.privacy
        self.audit = None
        audit = privacy.audit if privacy is not None else None
        if audit is not None and audit.membership and self.last_session >= 2:  # else nothing was trained
            from fedcare.studies.pain.audit import PainMembershipAudit

            self.audit = PainMembershipAudit(self, privacy.audit)

    def inits_at(self, seed: int) -> list[str]:
        """The pretrained inits (C, F) the methods of `seed` start from."""
        return sorted({m.init for m in self.plan[seed]} - {"N"})

    def facts(self) -> dict:
        facts = {"subjects": self.subjects(), "test_sessions": self.test_sessions}
        if self.config.random_seeds is not None and "RANDOM" in self.config.methods:
            facts["random_seeds"] = self.config.random_seeds
        return facts

    def notes(self) -> list[str]:
        p = self.config.protocol
        overlap = sorted(set(p.pretrain_subjects) & set(p.subjects))
        if overlap and self.inits_needed:
            return [f"WARNING: subjects {overlap} are both pretraining and test subjects (protocol.allow_overlap): "
                    f"the pretrained methods test them with a model pretrained on their own frames."]
        return []

    # -- data references --------------------------------------------------------------
    def subjects(self) -> list[int]:
        """The protocol's subjects whose site has joined (on Flower a site may be missing)."""
        return [k for k in self.config.protocol.subjects if k in self.summaries]

    def session_refs(self, session: int) -> dict[int, SessionFrames]:
        """Subjects with frames in `session`, each with the reference to them."""
        refs = {}
        for k in self.subjects():
            summary = self.summaries[k]
            if session < summary["sessions"] and summary["has_frames"][session]:
                refs[k] = SessionFrames(session)
        return refs

    def training_sets(self, seed: int, upto: int) -> dict[int, TrainingSet]:
        refs = {}
        for k in self.subjects():
            summary = self.summaries[k]
            if summary["trainable"][min(upto, summary["sessions"] - 1)]:
                refs[k] = TrainingSet(seed, upto)
        return refs

    # -- models -----------------------------------------------------------------------
    def new_model(self, state: dict | None = None, seed: int = 0) -> PainCNN:
        model = self.study.composed.new_model()
        if state is None:
            glorot_init(model, torch_generator(seed, "init"))
        else:
            model.load_state_dict(state)
        return model

    def pretrain(self, seed: int, kind: str, init_state: dict) -> dict:
        """kind 'C' (centralized) or 'F' (FedAvg) on the pretraining subjects, early-stopped
        on their held-out frames; returns the best model's state dict. The split is drawn
        across the whole group: it needs the cohort in this process."""
        t, p = self.config.train, self.config.protocol
        train, val = pretraining_sets(self.runtime.local_data, p.pretrain_subjects, p.pretrain_val_fraction,
                                      numpy_rng(seed, "pretrain-split"))
        algorithm = "centralized" if kind == "C" else "fedavg"
        phase = f"pretrain-{'central' if kind == 'C' else 'federated'}"
        label = f"pretrain {kind}"
        federation = self.runtime.federation(self.new_model(init_state), algorithm, seed, t.client_fraction,
                                             label={"method": label, "seed": seed})
        result = federation.train_phase(
            phase, train, val, max_rounds=t.pretrain_rounds, patience=t.pretrain_patience,
            on_round=lambda info: self._round_record(label, seed, phase, info),
        )
        self._phase_record(label, seed, phase, result)
        return federation.global_message.clone().tensors  # every tensor is shared: the whole model

    # -- records ----------------------------------------------------------------------
    def _round_record(self, method: str, seed: int, phase: str, info: dict) -> None:
        self.record("round", method=method, seed=seed, phase=phase, **info)

    def _phase_record(self, method: str, seed: int, phase: str, result: PhaseResult) -> None:
        self.record("phase", method=method, seed=seed, phase=phase, rounds=result.rounds,
                    best_round=result.best_round, best_val_loss=result.best_val_loss)

    def test(self, federation: Federation, method: str, seed: int, session: int) -> None:
        """Each subject's personal model on its session `session`; the metrics are computed at the site."""
        self.evaluate_clients(federation, self.session_refs(session), "binary", method=method, seed=seed,
                              session=session)

    # -- the protocol -----------------------------------------------------------------
    def run_method(self, method: Method, seed: int, init_state: dict) -> None:
        """Walk the sessions; a resumed run takes the federation back after its last finished session."""
        t = self.config.train
        algorithm = method.algorithm or "fedavg"  # RANDOM / BC / BF: evaluated as they are, every client alike
        federation = self.runtime.federation(self.new_model(init_state), algorithm, seed, t.client_fraction,
                                             label={"method": method.label, "seed": seed})
        done = [s for s in self.test_sessions if self.finished(seed, method.label, s)]
        if done and method.algorithm is not None and len(done) < len(self.test_sessions):
            federation.load_state_dict(self.checkpoint.state("federation"))
        for s in self.test_sessions:
            if s in done:
                continue
            self.test(federation, method.label, seed, s)
            if method.algorithm is not None and s < self.last_session:
                train = self.training_sets(seed, s - 1)
                val = self.session_refs(s)
                phase = f"session-{s}"
                result = federation.train_phase(
                    phase, train, val, max_rounds=t.rounds, patience=t.patience,
                    on_round=lambda info: self._round_record(method.label, seed, phase, info),
                )
                self._phase_record(method.label, seed, phase, result)
            if s == self.last_session and self.audit is not None and method.algorithm not in (None, "centralized"):
                # the final models, before the federation is dropped (runs do not keep models)
                self.audit.run(federation, method.label, seed, self.last_session - 2, init_state)
            going_on = method.algorithm is not None and s < self.last_session
            self.finish_unit(f"seed {seed}: {method.label} session {s}", seed, method.label, s,
                             federation=federation.state_dict if going_on else None)

    def run(self) -> None:
        for seed, methods in self.plan.items():
            random_init = self.new_model(seed=seed).state_dict()
            inits = {"N": random_init}
            for kind in self.inits_at(seed):
                if self.finished(seed, f"pretrain {kind}"):
                    inits[kind] = self.checkpoint.state(f"init {kind}")
                    continue
                inits[kind] = self.pretrain(seed, kind, random_init)
                self.finish_unit(f"seed {seed}: pretrain {kind}", seed, f"pretrain {kind}", **{f"init {kind}": inits[kind]})
            for method in methods:
                units = [(seed, method.label, s) for s in self.test_sessions]
                self.stop_if_diverged(seed, method.label, units, lambda: self.run_method(method, seed, inits[method.init]))
