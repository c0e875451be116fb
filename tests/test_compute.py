"""What a run's numbers depend on besides its config (`fedcare.compute`): the facts run.json
records, when two of them compute alike, and the note a run across sites gets when its sites
do not."""

from types import SimpleNamespace

import torch

from fedcare.compute import compute_facts, describe, same_arithmetic
from fedcare.report.html import facts_table
from fedcare.runtime.flower.runtime import FlowerRuntime


def test_the_facts_are_this_process_torch_kernels_and_threads(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.delenv("MKL_CBWR", raising=False)
    try:
        torch.set_num_threads(1)
        facts = compute_facts()
    finally:
        torch.set_num_threads(before)
    assert facts["threads"] == 1  # as set when asked, not torch's default
    assert facts["torch"] == torch.__version__
    assert facts["cpu_kernels"] == torch.backends.cpu.get_cpu_capability()
    assert facts["kernel_settings"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"}  # only the variables that are set


def test_the_processor_name_alone_does_not_make_arithmetic_different():
    a = {"torch": "2.14.1", "cpu_kernels": "AVX512", "threads": 2, "processor": "AMD EPYC", "machine": "x86_64",
         "kernel_settings": {}}
    assert same_arithmetic(a, {**a, "processor": "AMD EPYC 9R14"})
    for key, other in [("cpu_kernels", "AVX2"), ("threads", 4), ("torch", "2.13.0"), ("machine", "aarch64"),
                       ("kernel_settings", {"MKL_CBWR": "AVX2"})]:
        assert not same_arithmetic(a, {**a, key: other}), key


def test_the_report_shows_the_compute_in_one_line():
    facts = {"torch": "2.14.1", "cpu_kernels": "AVX512", "threads": 2, "processor": "AMD EPYC", "machine": "x86_64",
             "kernel_settings": {"ONEDNN_MAX_CPU_ISA": "AVX2"}}
    line = describe(facts)
    assert line == "torch 2.14.1, CPU kernels AVX512, 2 threads, AMD EPYC (x86_64), ONEDNN_MAX_CPU_ISA=AVX2"
    html = facts_table({"compute": facts, "compute_changes": [{"after_units": 3, "compute": facts}]}, "run", [])
    assert f"<th>Compute</th><td>{line}</td>" in html
    assert "compute_changes" not in html  # told in the notes instead


def _runtime(compute: dict) -> FlowerRuntime:
    link = SimpleNamespace(compute=compute, missed=[], refused=[], participation=[], synthetic={},
                           site_of={c: f"site-{c}" for c in compute},
                           site_name=lambda c: f"site-{c}", grid=SimpleNamespace(faults=[]),
                           rejoined=[], asked_again=[])
    return FlowerRuntime(link, algorithm=None)


def test_a_run_across_sites_that_compute_differently_says_which():
    avx512 = {"torch": "2.14.1", "cpu_kernels": "AVX512", "threads": 2, "processor": "AMD EPYC", "machine": "x86_64",
              "kernel_settings": {}}
    avx2 = {**avx512, "cpu_kernels": "AVX2", "processor": "Intel Xeon"}
    alike = _runtime({43: avx512, 48: {**avx512, "processor": "AMD EPYC 9R14"}})
    assert alike.notes() == []
    assert alike.facts()["site_compute"] == {"site-43": avx512, "site-48": {**avx512, "processor": "AMD EPYC 9R14"}}
    mixed = _runtime({43: avx512, 48: avx2, 52: avx512})
    [note] = mixed.notes()
    assert note.startswith("The sites do not compute alike ('site-43', 'site-52': torch 2.14.1, CPU kernels AVX512")
    assert "'site-48': torch 2.14.1, CPU kernels AVX2" in note and "differ from these by rounding" in note
