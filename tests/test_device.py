"""The run's device reaches every tensor a run creates (`fedcare.device`), checked on a
machine without a GPU: torch's default device is set to "meta" (tensors without data) while
the run's device is the CPU, so a tensor created without saying its device (the run's, or
the host's for messages and state) is a meta tensor, and the first number read from it, or
the first copy into a real tensor, fails loudly. Every study runs one small round this way,
with DP-SGD, client-level DP and secure aggregation, and the vectorised clients; each run's
records must equal the same run's without the meta default, bit for bit. The harness itself
is shown to catch a tensor created without a device (the aggregation before this change)."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from fedcare.algorithms import fedavg
from fedcare.algorithms.base import ServerHalf
from fedcare.algorithms.messages import Message
from fedcare.algorithms.training import TrainSettings
from fedcare.config import DPSGD, ClientDP, ConfigError, Privacy, SecureAggregation
from fedcare.device import Compute, resolve_device, to_host
from fedcare.runtime.clients import LocalClients
from fedcare.runtime.federation import Federation
from fedcare.runtime.vectorised import VectorisedClients
from fedcare.studies.run import run_study

from support.tiny import tiny_data, tiny_model


@contextmanager
def meta_default():
    """torch's default device is "meta" inside: a tensor created without a device has no data."""
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)


def run_on_meta(config, out: Path) -> Path:
    """`run_study` with the meta default from the moment the clients' data are loaded (data are
    read on the host by the data layer, before the run computes anything)."""
    def runtime(study, write):
        local = study.local_runtime(out.parent / f"{out.name}-data", None)
        torch.set_default_device("meta")
        return local

    try:
        return run_study(config, out, runtime_factory=runtime)
    finally:
        torch.set_default_device(None)


def lines(run_dir: Path) -> list[dict]:
    """The run's records (on the meta run, the runtime factory's run has no checkpoints: same records)."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def same_run_both_ways(config, tmp_path: Path) -> list[dict]:
    on_meta = lines(run_on_meta(config, tmp_path / "meta"))
    plain = lines(run_study(config, tmp_path / "plain"))
    assert on_meta == plain  # the same numbers: the device plumbing changes no arithmetic
    return on_meta


def _pain(**update):
    from support.pain import small_config

    base = small_config()
    return base.model_copy(update={"methods": ["BC", "F(C)", "FP(C)"],
                                   "train": base.train.model_copy(update={"rounds": 1, "pretrain_rounds": 1}),
                                   **update})


def test_pain_study_creates_no_tensor_without_its_device(tmp_path):
    records = same_run_both_ways(_pain(), tmp_path)
    assert {r.get("method") for r in records if r["type"] == "client_eval"} == {"BC", "F(C)", "FP(C)"}


def test_dp_sgd_and_secure_aggregation_create_no_tensor_without_their_device(tmp_path):
    privacy = Privacy(dp_sgd=DPSGD(), secure_aggregation=SecureAggregation())
    records = same_run_both_ways(_pain(methods=["F(N)"], privacy=privacy), tmp_path)
    assert any(r.get("dp_epsilon", 0) > 0 for r in records if r["type"] == "round")


def test_fedhealth2_study_and_client_dp_create_no_tensor_without_their_device(tmp_path):
    from support.fedhealth2 import METHODS, small_config

    base = small_config()
    one_round = {"train": base.train.model_copy(update={"rounds": 1}),
                 "options": base.options.model_copy(update={"ffedap_warmup_rounds": 1})}
    records = same_run_both_ways(base.model_copy(update=one_round), tmp_path / "all")
    assert {r["method"] for r in records if r["type"] == "client_eval"} == set(METHODS)
    # client-level DP covers the plain-averaging algorithms
    private = base.model_copy(update={**one_round, "methods": ["fedavg", "fedbn"],
                                      "privacy": Privacy(client_dp=ClientDP(noise_multiplier=0.1, clipping_norm=5.0))})
    records = same_run_both_ways(private, tmp_path / "client-dp")
    assert any("client_dp_epsilon" in r for r in records if r["type"] == "round")


@pytest.fixture(scope="module")
def surgical_copies(tmp_path_factory) -> tuple[Path, Path]:
    from support.surgical import SYNTH

    from fedcare.data.surgical.synthetic import generate_surgical

    root = tmp_path_factory.mktemp("surgical") / "copies"
    generate_surgical(root, **SYNTH)
    return root, tmp_path_factory.mktemp("frames")


def test_surgical_study_creates_no_tensor_without_its_device(surgical_copies, tmp_path):
    from support.surgical import ALL, tiny

    records = same_run_both_ways(tiny(*surgical_copies, methods=ALL, rounds=1), tmp_path)
    assert {r["method"] for r in records if r["type"] == "client_eval"} >= {"feddyn", "feddg", "fedprox", "cent"}


def test_facerec_study_creates_no_tensor_without_its_device(tmp_path):
    from support.facerec import small_config

    from fedcare.data.celeba.synthetic import generate_celeba

    root = tmp_path / "celeba"
    generate_celeba(root, seed=0, identities=16, images_per_identity=12, workers=1)
    config = small_config(root, tmp_path / "cache", methods=("fedavg-local", "hfmaml", "fedavg-fair", "fedfr"))
    records = same_run_both_ways(config, tmp_path)
    assert {r["method"] for r in records if r["type"] == "client_eval"} >= {"fedavg-local", "hfmaml", "fedavg-fair", "fedfr"}


def _vectorised_round(clients_class, meta: bool) -> Message:
    from fedcare.algorithms import pfdl

    data = {c: tiny_data(c) for c in range(3)}
    settings = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)
    algorithm = pfdl(settings, shared_paths=("features",), finetune_epochs=1)
    model = tiny_model()
    federation = Federation(model, algorithm, 0, clients=clients_class(model, algorithm.client, 0))
    with meta_default() if meta else _nothing():
        federation.run_round("train", 1, data)
        metrics = federation.evaluate(data, "binary")
    return federation.global_message, metrics


@contextmanager
def _nothing():
    yield


def test_vectorised_clients_create_no_tensor_without_their_device():
    message, metrics = _vectorised_round(VectorisedClients, meta=True)
    plain_message, plain_metrics = _vectorised_round(VectorisedClients, meta=False)
    assert all(t.device.type == "cpu" for t in message.tensors.values())
    assert all(torch.equal(message.tensors[k], plain_message.tensors[k]) for k in message.tensors)
    assert metrics == plain_metrics


def test_the_harness_fails_on_a_tensor_created_without_a_device(monkeypatch):
    """The server's average as it was before the device plumbing: its accumulator made with
    torch's default device. Under the meta default the round's average has no data, and the
    first number read from it fails loudly: the federation's check that the new global model is
    finite (`fedcare.runtime.replies.global_problem`) reads it at once."""
    def old_aggregate(self, current, replies):
        weights, averaged = self.weights(replies), {}
        for name, old in current.tensors.items():
            acc = torch.zeros(old.shape, dtype=torch.float64)  # no device: the planted fault
            for client in sorted(replies):
                acc += weights[client] * replies[client].tensors[name].double()
            averaged[name] = acc.to(old.dtype)
        return Message(averaged)

    model, data = tiny_model(), {c: tiny_data(c) for c in range(2)}
    algorithm = fedavg(TrainSettings(lr=0.05, batch_size=8, local_epochs=1))
    federation = Federation(model, algorithm, 0, clients=LocalClients(model, algorithm.client, 0))
    monkeypatch.setattr(ServerHalf, "aggregate", old_aggregate)
    with meta_default():
        with pytest.raises((RuntimeError, NotImplementedError), match="meta"):
            federation.run_round("train", 1, data)  # the meta average is read before it is kept


def test_an_unavailable_device_is_a_config_error_naming_it(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="no CUDA GPU"):
        resolve_device("cuda")
    from support.fedhealth2 import small_config

    config = small_config()
    config = config.model_copy(update={"runtime": config.runtime.model_copy(update={"device": "cuda:1"})})
    with pytest.raises(ConfigError, match="runtime.device: device 'cuda:1'"):
        run_study(config, tmp_path / "run")
    assert not (tmp_path / "run").exists() and not (tmp_path / "run.partial").exists()


def test_auto_is_the_cpu_on_a_machine_without_an_accelerator():
    if torch.cuda.is_available() or torch.backends.mps.is_available():
        pytest.skip("this machine has an accelerator")
    assert resolve_device("auto") == torch.device("cpu")


def test_what_crosses_a_boundary_is_on_the_host_and_cpu_tensors_are_not_copied():
    cpu = torch.ones(2)
    state = {"a": cpu, "b": [cpu, (cpu, 3)], "c": "text"}
    assert to_host(state) is state  # nothing to move: the same object, a state dict keeps its metadata
    on_meta = {"a": torch.ones(2, device="meta")}
    with pytest.raises(NotImplementedError):  # moving it is attempted (a meta tensor has no data to move)
        to_host(on_meta)


def test_run_json_records_device_precision_and_determinism(tmp_path):
    from support.fedhealth2 import small_config

    base = small_config()
    config = base.model_copy(update={"methods": ["fedavg"], "train": base.train.model_copy(update={"rounds": 1})})
    out = run_study(config, tmp_path / "run")
    compute = json.loads((out / "run.json").read_text())["compute"]
    assert (compute["device"], compute["precision"], compute["deterministic"]) == ("cpu", "fp32", False)
    assert Compute().reproducible() is None  # the CPU: bit-reproducible, no note


def test_deterministic_cuda_sets_torchs_deterministic_algorithms_and_the_cublas_workspace(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    cuda = Compute(torch.device("cuda"), "fp32", deterministic=True)
    try:
        cuda.apply()
        assert torch.are_deterministic_algorithms_enabled()
        assert __import__("os").environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(False)
    assert cuda.reproducible() is None
    # without it the report says why a rerun may differ
    assert "deterministic = true" in Compute(torch.device("cuda"), "fp32", deterministic=False).reproducible()
    assert Compute(torch.device("cpu"), "bf16").reproducible() is None  # the CPU's kernels are deterministic


def test_a_site_chooses_its_own_device_and_a_wrong_one_is_named():
    from fedcare.deployment.app import site_device
    from support.fedhealth2 import small_config

    config = small_config()
    assert site_device(config, None) is config
    assert site_device(config, "cpu").runtime.device == "cpu"
    with pytest.raises(ConfigError, match="node config device"):
        site_device(config, "gpu0")


def test_the_simulation_engine_gets_the_experiments_gpu_share():
    from fedcare.deployment.cli import with_gpus

    assert with_gpus("num-supernodes=3", 0.25) == "num-supernodes=3 client-resources-num-gpus=0.25"
    assert with_gpus("num-supernodes=3", 0.0) == "num-supernodes=3"
    assert with_gpus("client-resources-num-gpus=1", 0.5) == "client-resources-num-gpus=1"  # the user's own kept


def test_supernode_device_goes_into_the_node_config_and_an_absent_one_is_refused(tmp_path):
    from typer.testing import CliRunner

    from fedcare.cli import app

    base = ["flower", "supernode", "--site", "43", "--data-dir", str(tmp_path), "--state-dir", str(tmp_path / "s"),
            "--insecure", "--no-warm", "--dry-run"]
    result = CliRunner().invoke(app, [*base, "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert 'device="cpu"' in result.output
    if not torch.cuda.is_available():
        result = CliRunner().invoke(app, [*base, "--device", "cuda"])
        assert result.exit_code == 2 and "--device: device 'cuda': this machine has no CUDA GPU" in result.output
    result = CliRunner().invoke(app, [*base, "--device", "tpu"])
    assert result.exit_code == 2 and "--device 'tpu'" in result.output
