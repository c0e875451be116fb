"""The privacy audit's protocol, per seed:

1. **Membership inference**, one unit per case (a method, plain or under DP-SGD at one noise
   level): `train.rounds` rounds of the method on the audit clients, then the loss attack
   (`fedcare.privacy.audit`) on every client's training examples against its held-out ones,
   from two places: a peer (the next client's model: FedAvg's global model; PFDL and FedBN:
   the shared layers with the peer's own private ones; local: a model that never saw the
   victim) and the victim's own model (what a breach of that client's device exposes); and
   offline LiRA (`fedcare.privacy.lira`) from the same two places, its out distribution from
   `protocol.shadow_models` shadow federations: the case's method and noise level trained the
   same way on each client's shadow sets (the public pool of its distribution, never a
   member), each from its own initial model; the shadow's own / peer model of a client plays
   the target's. One "audit" record per case: epsilon, accuracy, and each attack's AUC and TPR
   at FPR 1% and 0.1%, averaged over the clients.
2. **Gradient inversion**, one unit per case of `privacy_audit.inversion.CASES`: the attack
   on one FedSGD step of the pain CNN on a batch of synthetic frames. One "inversion" record
   per case (PSNR, SSIM, the reconstructions); the first unit also writes the true frames
   ("inversion_frames") and the flat-image baseline.

Every unit starts from its own seeded state (torch's generator reset to the run seed for the
model's init; the data, the dummy images and DP-SGD's noise from their own derived
generators), so a resumed run's records are byte-identical to an uninterrupted one's."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import torch

from fedcare.algorithms.base import DP_EPSILON
from fedcare.privacy import private_model
from fedcare.runtime.refs import DataRef, SeededSplit
from fedcare.seeding import derive_seed
from fedcare.studies.base import StudyProtocol
from fedcare.studies.privacy_audit.data import Shadow
from fedcare.studies.privacy_audit.methods import (
    Level, algorithm_name, budget_of, cases, dp_sgd, level_label, one_run_cases, one_run_label, one_run_name,
)
from fedcare.tasks import BINARY

AUDIT, INVERSION, FRAMES = "audit", "inversion", "inversion_frames"  # record types
PIXEL_DIGITS = 4  # the pictures' pixels in the records (in [0, 1]; far below a grey level)
NO_EPSILON = "no DP-SGD: the privacy loss has no bound (epsilon is infinite)"


class PrivacyAuditProtocol(StudyProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from fedcare.studies.privacy_audit.inversion import CASES

        self.units_total = len(self.config.seeds) * (len(cases(self.config)) + len(one_run_cases(self.config))
                                                     + len(CASES))

    def facts(self) -> dict:
        d = self.config.data
        return {"clients": d.clients, "members": d.train, "non_members": d.test, "rounds": self.config.train.rounds}

    def run(self) -> None:
        for seed in self.config.seeds:
            for level, method in cases(self.config):
                label = level_label(level)
                if not self.finished(seed, label, method):
                    sigma = None if isinstance(level, str) else level  # a budget's sigma is calibrated per client
                    self.record(AUDIT, seed=seed, privacy=label, sigma=sigma, target_epsilon=budget_of(level),
                                **self.audit(seed, method, level))
                    self.finish_unit(f"seed {seed}: {method}, {label}", seed, label, method)
            for protection, sigma, method in one_run_cases(self.config):
                label = one_run_label(protection, sigma)
                if not self.finished(seed, "one-run", label, method):
                    self.one_run(seed, protection, sigma, method)
                    self.finish_unit(f"seed {seed}: one-run audit of {method}, {label}", seed, "one-run", label, method)
            self.invert(seed)

    # -- membership inference -----------------------------------------------------------
    def audit(self, seed: int, method: str, sigma: Level) -> dict:
        """Train the case's federation, then attack every client from a peer's and its own model:
        the loss attack, and LiRA against the shadow federations' models."""
        from fedcare.algorithms.training import predict
        from fedcare.privacy.audit import attack_power, attack_scores, per_example_losses
        from fedcare.privacy.lira import logit_confidence, offline_scores
        from fedcare.privacy.rmia import probabilities, scores as rmia_scores

        clients = sorted(self.runtime.summaries())
        members, held_out = SeededSplit("train", seed), SeededSplit("test", seed)
        sets = {c: tuple(self.runtime.pool({c: ref}) for ref in (members, held_out)) for c in clients}

        def losses(view: str, federation, of: dict | None = None) -> dict[int, tuple]:
            """Per client, the losses of its sets `of` (default: members, held-out) under its own or
            its peer's model."""
            out = {}
            for i, c in enumerate(clients):  # one working model: each personal model is used before the next
                model = federation.personal_model(c if view == "own" else clients[(i + 1) % len(clients)])
                out[c] = tuple(per_example_losses(model, data, BINARY) for data in (of or sets)[c])
            return out

        info, federation = self.train_case(seed, method, sigma, members, seed)
        spent = {}
        if sigma is not None:  # each client's epsilon over the whole run (fit and fine-tuning): the budget table
            spent = federation.privacy_spent({c: members for c in clients})
            self.record_budget(seed, f"{method} ({level_label(sigma)})", spent, budget_of(sigma),
                               info.get("skipped_rounds", {}))
        target = {view: losses(view, federation) for view in ("own", "peer")}
        accuracy = []
        for c in clients:
            scores, _ = predict(federation.personal_model(c), sets[c][1], BINARY)
            accuracy.append(float(((scores > 0.5).float() == sets[c][1].y).float().mean()))
        shadows = {view: [] for view in target}
        # RMIA's population: each client's second public pool, in neither the target nor the reference model
        population = {c: (self.runtime.pool({c: Shadow(seed, 2)}),) for c in clients} \
            if self.config.protocol.shadow_models >= 2 else {}
        target_population = {view: losses(view, federation, population) for view in target} if population else {}
        reference_population = {}
        for s in range(1, self.config.protocol.shadow_models + 1):
            _, shadow = self.train_case(seed, method, sigma, Shadow(seed, s), derive_seed(seed, "lira-shadow", s))
            for view in shadows:
                shadows[view].append(losses(view, shadow))
            if s == 1 and population:  # the first shadow federation is RMIA's one reference model
                reference_population = {view: losses(view, shadow, population) for view in target}
        result = {}
        for view in ("peer", "own"):
            loss = [attack_scores(*target[view][c]) for c in clients]
            result |= {f"{view}_auc": float(np.mean([r.auc for r in loss])),
                       f"{view}_tpr_1pct": float(np.mean([r.tpr_at_1pct_fpr for r in loss])),
                       f"{view}_tpr_01pct": float(np.mean([r.tpr_at_01pct_fpr for r in loss]))}
            if shadows[view]:
                lira = []
                for c in clients:
                    members, held_out = (offline_scores(logit_confidence(target[view][c][k]),
                                                        np.stack([logit_confidence(sh[c][k]) for sh in shadows[view]]))
                                         for k in (0, 1))
                    lira.append(attack_power(members, held_out))
                result |= {f"{view}_lira_auc": float(np.mean([r.auc for r in lira])),
                           f"{view}_lira_tpr_1pct": float(np.mean([r.tpr_at_1pct_fpr for r in lira])),
                           f"{view}_lira_tpr_01pct": float(np.mean([r.tpr_at_01pct_fpr for r in lira]))}
            if reference_population:
                attacks = []
                for c in clients:
                    z = (probabilities(target_population[view][c][0]), probabilities(reference_population[view][c][0]))
                    members, held_out = (rmia_scores(probabilities(target[view][c][k]),
                                                     probabilities(shadows[view][0][c][k]), *z) for k in (0, 1))
                    attacks.append(attack_power(members, held_out))
                result |= {f"{view}_rmia_auc": float(np.mean([r.auc for r in attacks])),
                           f"{view}_rmia_tpr_1pct": float(np.mean([r.tpr_at_1pct_fpr for r in attacks])),
                           f"{view}_rmia_tpr_01pct": float(np.mean([r.tpr_at_01pct_fpr for r in attacks]))}
        # the largest over the clients, whole run: PFDL's fine-tuning after the last round counts too
        epsilon = max(s[DP_EPSILON] for s in spent.values()) if spent else info.get(DP_EPSILON)
        return {"method": method, "epsilon": epsilon, **({"epsilon_note": NO_EPSILON} if epsilon is None else {}),
                "accuracy": float(np.mean(accuracy)), **result, "shadow_models": self.config.protocol.shadow_models,
                "clients": len(clients), "members": self.config.data.train, "non_members": self.config.data.test}

    def train_case(self, seed: int, method: str, sigma: Level, data: DataRef, own_seed: int, name: str | None = None):
        """(last round's info with each client's skipped rounds, federation) of the case's method at its level after
        `train.rounds` rounds on each client's `data` set; `own_seed` seeds its
        randomness (torch's global generator for the model's init, for this federation only;
        batches and DP-SGD's noise): the run seed for the target, a derived one per shadow.
        `name`: another algorithm of the same model (the one-run audit's)."""
        clients = sorted(self.runtime.summaries())
        with torch.random.fork_rng():
            torch.manual_seed(own_seed)
            model = private_model(self.study.composed.new_model(), dp_sgd(sigma, self.config))
            federation = self.runtime.federation(model, name or algorithm_name(method, sigma), own_seed)
            info, skipped = {}, Counter()
            for rnd in range(1, self.config.train.rounds + 1):
                info = federation.run_round("train", rnd, {c: data for c in clients})
                skipped.update(info.get("skipped", []))  # out of budget: these clients did not train this round
        return {**info, "skipped_rounds": dict(skipped)}, federation

    # -- the one-run audits -----------------------------------------------------------------
    def one_run(self, seed: int, protection: str, sigma: float | None, method: str) -> None:
        """One training run of the case with its canaries (DP-SGD's level) or canary clients
        (client-level DP), then its epsilon-hat per client and pooled beside the accountant's
        epsilon: "epsilon_audit" records (`fedcare.privacy.report`)."""
        from fedcare.privacy.canaries import DP_AUDIT
        from fedcare.privacy.canary_clients import AUDIT_PREFIX
        from fedcare.privacy.client_dp import CLIENT_DP_EPSILON
        from fedcare.privacy.report import EPSILON_AUDIT

        label = one_run_label(protection, sigma)
        info, _ = self.train_case(seed, method, sigma if protection == "dp_sgd" else None, SeededSplit("train", seed),
                                  seed, one_run_name(protection, sigma, method))
        point = {"seed": seed, "method": f"{method} ({label})", "privacy": label, "level": protection}
        if protection == "dp_sgd":
            audit = info[DP_AUDIT]
            for client, result in [("pooled", audit["pooled"]), *sorted(audit["clients"].items())]:
                self.record(EPSILON_AUDIT, **point, client=client, estimate=None, **result)
        else:
            got = {k.removeprefix(AUDIT_PREFIX): v for k, v in info.items() if k.startswith(AUDIT_PREFIX)}
            eps = info[CLIENT_DP_EPSILON]
            self.record(EPSILON_AUDIT, **point, client="pooled", delta=self.config.protocol.delta,
                        epsilon=None if math.isinf(eps) else eps,
                        epsilon_hat=got["epsilon_hat"], estimate=got["estimate"], m=int(got["m"]), r=int(got["r"]),
                        v=int(got["v"]), confidence=got["confidence"],
                        p_value=None if math.isnan(got["p_value"]) else got["p_value"])

    def record_budget(self, seed: int, case: str, spent: dict, target: float | None, skipped: dict) -> None:
        from fedcare.privacy.report import BUDGET  # the report stack only when a DP case runs (not at a site)

        for client, s in sorted(spent.items()):
            self.record(BUDGET, seed=seed, method=case, protection="dp_sgd", client=str(client), epsilon=s[DP_EPSILON],
                        steps=s["dp_steps"], sigma=s["dp_sigma"], target_epsilon=target,
                        delta=self.config.protocol.delta, sampling="poisson", skipped=skipped.get(str(client), 0))

    # -- gradient inversion -------------------------------------------------------------
    def invert(self, seed: int) -> None:
        """Each case of the gradient inversion, on the seed's batch of synthetic frames."""
        from fedcare.privacy.inversion import InversionSettings, flat_baseline
        from fedcare.studies.privacy_audit.inversion import BASELINE, CASES, attack_case, case_label

        todo = [case for case in CASES if not self.finished(seed, INVERSION, case.name)]
        if not todo:
            return
        settings = InversionSettings(**self.config.inversion.model_dump())
        x, y = self.runtime.local_data.batch(seed)
        if len(todo) == len(CASES):  # the first unit: the true frames and what recovering nothing scores
            base = flat_baseline(x)
            self.record(FRAMES, seed=seed, settings=self.config.inversion.model_dump(), labels=y.tolist(),
                        images=_pixels(x))
            self.record(INVERSION, seed=seed, case=BASELINE, observed_tensors=0, psnr=base.psnr, ssim=base.ssim)
        for case in todo:
            label = case_label(case, settings)
            recon, scores, observed = attack_case(case, x, y, settings, seed)
            self.record(INVERSION, seed=seed, case=label, observed_tensors=observed, psnr=scores.psnr,
                        ssim=scores.ssim, images=_pixels(recon))
            self.finish_unit(f"seed {seed}: gradient inversion, {label}", seed, INVERSION, case.name)


def _pixels(images: torch.Tensor) -> list:
    """Images (B, 1, S, S) in [0, 1] as nested lists, rounded for the records."""
    return np.round(images[:, 0].double().numpy(), PIXEL_DIGITS).tolist()
