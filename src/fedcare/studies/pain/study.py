"""The pain study end to end (Tobis thesis §6.2.3, PFDL paper Fig. 4).

Per seed: pretrain on Group 1 (centrally and/or federatedly, as the methods need), then for
each method walk the sessions: test every subject's own model on session s, train on the
balanced sessions before s with session s as validation (early stopping, restore best), and
move on. Test records go to metrics.jsonl; the report is built from them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


from fedcare.algorithms.training import ClientData
from fedcare.config import PainExperiment, to_toml
from fedcare.data.synthetic.pain import generate_pain_cohort
from fedcare.models.pain_cnn import PainCNN, glorot_init
from fedcare.report import build_report
from fedcare.runtime.clients import LocalClients
from fedcare.runtime.simulation import Federation, PhaseResult
from fedcare.seeding import numpy_rng, torch_generator
from fedcare.studies.pain.cohort import PainCohort, PainSite, pretraining_sets, read_cohort
from fedcare.studies.pain.methods import Method, make_algorithm
from fedcare.studies.rundir import (
    SYNTHETIC_DIR,
    Progress,
    start_run,
    partial_run_directory,
    records_writer,
    write_run_info,
)


class LocalRuntime:
    """The pain study's clients in this process: every subject's site built from one cohort.
    (On Flower, `fedcare.runtime.flower.study` provides the same two methods, with each
    subject's data at its own site.)"""

    def __init__(self, config: PainExperiment, cohort: PainCohort):
        self.config = config
        self.cohort = cohort
        per_class = config.protocol.balance_per_class
        self.sites = {k: PainSite(k, cohort.sessions[k], per_class) for k in config.protocol.subjects}

    def summaries(self) -> dict[int, dict]:
        return {k: site.summary() for k, site in self.sites.items()}

    def federation(self, model: PainCNN, algorithm: str, seed: int, client_fraction: float = 1.0,
                   label: dict | None = None) -> Federation:
        algo = make_algorithm(algorithm, self.config)
        clients = LocalClients(model, algo.client, seed, resolve=lambda k, ref: self.sites[k].data(ref))
        return Federation(model, algo, seed, client_fraction=client_fraction, clients=clients)

    def pretraining_sets(self, seed: int) -> tuple[dict[int, ClientData], dict[int, ClientData]]:
        p = self.config.protocol
        return pretraining_sets(self.cohort, p.pretrain_subjects, p.pretrain_val_fraction, numpy_rng(seed, "pretrain-split"))


class PainStudy:
    """The protocol, as the server runs it: it sees each subject's `PainSite.summary()` and
    addresses data by reference; the runtime's clients hold the frames."""

    def __init__(self, config: PainExperiment, runtime, write: Callable[[dict], None], progress: Progress | None):
        self.config = config
        self.runtime = runtime
        self.summaries = runtime.summaries()
        self.write = write
        self.progress = progress or (lambda *_: None)
        present = max(self.summaries[k]["sessions"] for k in self.subjects()) - 1
        self.last_session = min(present, config.protocol.last_session or present)
        self.test_sessions = list(range(1, self.last_session + 1))
        self.units_total = 0
        self.units_done = 0

    # -- data references --------------------------------------------------------------
    def subjects(self) -> list[int]:
        """The protocol's subjects whose site has joined (on Flower a site may be missing)."""
        return [k for k in self.config.protocol.subjects if k in self.summaries]

    def session_refs(self, session: int) -> dict[int, str]:
        """Subjects with frames in `session`, each with the reference to them."""
        refs = {}
        for k in self.subjects():
            summary = self.summaries[k]
            if session < summary["sessions"] and summary["has_frames"][session]:
                refs[k] = f"session/{session}"
        return refs

    def training_sets(self, seed: int, upto: int) -> dict[int, str]:
        refs = {}
        for k in self.subjects():
            summary = self.summaries[k]
            if summary["trainable"][min(upto, summary["sessions"] - 1)]:
                refs[k] = f"train/{seed}/{upto}"
        return refs

    # -- models -----------------------------------------------------------------------
    def new_model(self, state: dict | None = None, seed: int = 0) -> PainCNN:
        model = PainCNN(self.config.protocol.image_size)
        if state is None:
            glorot_init(model, torch_generator(seed, "init"))
        else:
            model.load_state_dict(state)
        return model

    def pretrain(self, seed: int, kind: str, init_state: dict) -> dict:
        """kind 'C' (centralized) or 'F' (FedAvg) on the pretraining subjects, early-stopped
        on their held-out frames; returns the best model's state dict."""
        t = self.config.train
        train, val = self.runtime.pretraining_sets(seed)
        algorithm = "centralized" if kind == "C" else "fedavg"
        phase = f"pretrain-{'central' if kind == 'C' else 'federated'}"
        label = f"pretrain {kind}"
        federation = self.runtime.federation(self.new_model(init_state), algorithm, seed, t.client_fraction,
                                             label={"method": label, "seed": seed})
        result = federation.train_phase(
            phase, train, val, max_rounds=t.pretrain_max_rounds, patience=t.pretrain_patience,
            on_round=lambda info: self._round_record(label, seed, phase, info),
        )
        self._phase_record(label, seed, phase, result)
        self._advance(f"seed {seed}: {label}")
        return federation.global_message.clone().tensors  # every tensor is shared: the whole model

    # -- records ----------------------------------------------------------------------
    def _round_record(self, method: str, seed: int, phase: str, info: dict) -> None:
        self.write({"type": "round", "study": "pain", "method": method, "seed": seed, "phase": phase, **info})

    def _phase_record(self, method: str, seed: int, phase: str, result: PhaseResult) -> None:
        self.write({
            "type": "phase", "study": "pain", "method": method, "seed": seed, "phase": phase,
            "rounds": result.rounds, "best_round": result.best_round, "best_val_loss": result.best_val_loss,
        })

    def _advance(self, description: str) -> None:
        self.units_done += 1
        self.progress(description, self.units_done, self.units_total)

    def test(self, federation: Federation, method: str, seed: int, session: int) -> None:
        """Each subject's personal model on its session `session`; the metrics are computed at the site."""
        for k, metrics in sorted(federation.evaluate(self.session_refs(session), "binary").items()):
            self.write({"type": "test", "study": "pain", "method": method, "seed": seed, "session": session,
                        "client": k, **metrics})

    # -- the protocol -----------------------------------------------------------------
    def run_method(self, method: Method, seed: int, init_state: dict) -> None:
        t = self.config.train
        if method.algorithm is None:  # RANDOM / BC / BF: evaluated as they are, every client alike
            federation = self.runtime.federation(self.new_model(init_state), "fedavg", seed,
                                                 label={"method": method.label, "seed": seed})
            for s in self.test_sessions:
                self.test(federation, method.label, seed, s)
                self._advance(f"seed {seed}: {method.label} session {s}")
            return
        federation = self.runtime.federation(self.new_model(init_state), method.algorithm, seed, t.client_fraction,
                                             label={"method": method.label, "seed": seed})
        for s in self.test_sessions:
            self.test(federation, method.label, seed, s)
            if s < self.last_session:
                train = self.training_sets(seed, s - 1)
                val = self.session_refs(s)
                phase = f"session-{s}"
                result = federation.train_phase(
                    phase, train, val, max_rounds=t.max_rounds, patience=t.patience,
                    on_round=lambda info: self._round_record(method.label, seed, phase, info),
                )
                self._phase_record(method.label, seed, phase, result)
            self._advance(f"seed {seed}: {method.label} session {s}")

    def run(self) -> None:
        methods = [Method.parse(m) for m in self.config.methods]
        inits_needed = sorted({m.init for m in methods} - {"N"})
        self.units_total = len(self.config.seeds) * (len(inits_needed) + len(methods) * len(self.test_sessions))
        for seed in self.config.seeds:
            random_init = self.new_model(seed=seed).state_dict()
            inits = {"N": random_init}
            for kind in inits_needed:
                inits[kind] = self.pretrain(seed, kind, random_init)
            for method in methods:
                self.run_method(method, seed, inits[method.init])


def load_pain_data(config: PainExperiment, workdir: Path, progress: Progress | None = None) -> PainCohort:
    """Load (or, for [data.synthetic], generate into `workdir`) and preprocess the cohort."""
    data = config.data
    if data.synthetic is not None:
        syn = data.synthetic
        root = workdir / SYNTHETIC_DIR
        generate_pain_cohort(
            root, seed=syn.seed, subjects=syn.subjects, frame_scale=syn.frame_scale, image_size=syn.image_size,
            min_frames_per_sequence=syn.min_frames_per_sequence,
            progress=(lambda d, t: progress("generating synthetic cohort", d, t)) if progress else None,
        )
    else:
        root = data.root
    protocol = config.protocol
    return read_cohort(config, root, sorted(set(protocol.subjects) | set(protocol.pretrain_subjects)), progress)


def run_pain_experiment(
    config: PainExperiment, out: Path, *, config_file: str = "", progress: Progress | None = None,
    keep_partial: bool = False, runtime_factory: Callable | None = None,
) -> Path:
    """Run the study into `out` and build its report (see `partial_run_directory`).
    `runtime_factory(write)` gives the runtime whose clients hold the data (Flower's, with
    `write` for its records); default: every subject in this process."""
    with partial_run_directory(out, keep_partial) as partial:
        started = start_run(partial, config, to_toml(config))
        with records_writer(partial / "metrics.jsonl") as write:
            if runtime_factory is None:
                cohort = load_pain_data(config, partial, progress)
                runtime = LocalRuntime(config, cohort)
                synthetic = cohort.synthetic
            else:
                runtime = runtime_factory(write)
                synthetic = runtime.synthetic
            study = PainStudy(config, runtime, write, progress)
            t0 = time.perf_counter()
            study.run()
            seconds = time.perf_counter() - t0
        notes = []
        if synthetic:
            notes.append("Data: a synthetic cohort in the UNBC-McMaster layout generated by fedcare, not real patients.")
        facts = {}
        if runtime_factory is not None:  # the sites and what each missed
            facts = runtime.facts()
            notes += runtime.notes()
        write_run_info(
            partial, out, study="pain", title=config.title, synthetic=synthetic, config_file=config_file,
            seeds=config.seeds, methods=config.methods, started=started, training_seconds=round(seconds, 2),
            subjects=study.subjects(), test_sessions=study.test_sessions, notes=notes, **facts,
        )
        build_report(partial)
    return Path(out)
