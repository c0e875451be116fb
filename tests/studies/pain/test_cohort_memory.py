"""The pain data path's memory: each frame is held once (its pre-crop uint8 image), the four
variants are cut when a batch asks for them, and a run's frames can live in a memory-mapped
file instead of the process. Measured with tracemalloc, which sees NumPy's buffers (not
torch's or a memory map's), at a reduced scale: the shared 4-subject synthetic cohort."""

import os
import tracemalloc

import numpy as np
import torch
import pytest

from fedcare.data.transforms import four_variants, precrop_size, preprocess
from fedcare.data.unbc.reader import load_unbc, read_grey
from fedcare.seeding import numpy_rng
from fedcare.studies.pain.cohort import PainSite, SessionFrames, TrainingSet, build_cohort, pretraining_sets

SIZE = 32


def _cohort(ds, store_dir=None):
    return build_cohort(ds, ds.subjects(), image_size=SIZE, crop_ratio=215 / 250, pspi_threshold=1,
                        drop_black_frames=True, augment_seed=0, store_dir=store_dir)


def _traced_peak(fn):
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_each_frame_is_held_once_and_datasets_hold_no_images(pain_cohort):
    ds = load_unbc(pain_cohort)
    _cohort(ds)  # first calls import and cache what later ones reuse: trace a second one
    cohort, peak = _traced_peak(lambda: _cohort(ds))
    frames = sum(len(s.labels) for sessions in cohort.sessions.values() for s in sessions)
    one_copy = frames * precrop_size(SIZE) ** 2
    four_variants_bytes = frames * 4 * SIZE * SIZE  # what the cohort held before: 2.9x one copy
    assert frames == len(ds.frames) > 100
    # building holds the store plus one frame's decoding at a time
    assert one_copy <= peak < 1.2 * one_copy < four_variants_bytes / 2

    def every_dataset():
        train, val = pretraining_sets(cohort, [42], 0.2, np.random.default_rng(0))
        site = PainSite(43, cohort.sessions[43], 40, True)
        tests = [site.data(SessionFrames(s)) for s in range(len(site.sessions))]
        return train, val, tests, site.data(TrainingSet(1, 2))

    every_dataset()
    (train, val, tests, balanced), peak = _traced_peak(every_dataset)
    items = sum(len(d) for d in [*train.values(), *val.values(), *tests, balanced])
    assert items > 400
    # an item costs its index row (3 int64) and its label, not its 32x32 image
    assert peak < items * 200 < items * SIZE * SIZE
    # and the images it cuts are the variants the cohort used to store, byte for byte
    session = cohort.sessions[43][1]
    frame = next(f for f in ds.frames if (f.subject, f.session) == (43, 1))
    sign = 1 if numpy_rng(0, "rotation", 43, frame.sequence, frame.index).random() < 0.5 else -1
    expected = four_variants(preprocess(read_grey(frame.image), SIZE), SIZE, sign)
    assert np.array_equal(session.as_client_data().x[0:4][:, 0].numpy(), expected)


def test_a_run_keeps_its_frames_in_a_nameless_memory_mapped_file(pain_cohort, tmp_path):
    ds = load_unbc(pain_cohort)
    in_memory = _cohort(ds)
    mapped, peak = _traced_peak(lambda: _cohort(ds, store_dir=tmp_path))
    frames = sum(len(s.labels) for sessions in mapped.sessions.values() for s in sessions)
    assert peak < frames * precrop_size(SIZE) ** 2 / 4  # the frames are not the process's memory
    first = mapped.sessions[43][0].frames
    assert isinstance(first.base, np.memmap) or isinstance(first, np.memmap)
    assert os.listdir(tmp_path) == []  # unlinked when created: nothing to clean, even after SIGKILL
    for subject, sessions in in_memory.sessions.items():
        for a, b in zip(sessions, mapped.sessions[subject]):
            assert np.array_equal(a.frames, b.frames) and np.array_equal(a.signs, b.signs)
            assert a.as_client_data().x[:].equal(b.as_client_data().x[:])


def test_an_unwritable_store_directory_is_a_clear_error(pain_cohort, tmp_path):
    from fedcare.studies.pain.cohort import PainDataError

    missing = tmp_path / "gone"
    with pytest.raises(PainDataError, match=f"{missing}: cannot create the frame store"):
        _cohort(load_unbc(pain_cohort), store_dir=missing)


def test_a_full_disk_is_found_before_any_frame_is_written(pain_cohort, tmp_path, monkeypatch):
    import errno

    from fedcare.studies.pain import cohort as cohort_module

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(cohort_module.os, "posix_fallocate", no_space)
    with pytest.raises(cohort_module.PainDataError, match="cannot create the frame store of .* MB.*No space left"):
        _cohort(load_unbc(pain_cohort), store_dir=tmp_path)
    assert os.listdir(tmp_path) == []


def test_evaluation_batches_shrink_with_the_image_size_and_keep_the_demos():
    from fedcare.studies.pain.config import PainExperiment
    from fedcare.studies.pain.methods import EVAL_PIXELS, eval_batch_size, make_algorithm

    assert [eval_batch_size(s) for s in (32, 48, 64)] == [512, 512, 512]  # the demo's and tests' batches
    assert eval_batch_size(215) == 45 and 45 * 215 * 215 <= EVAL_PIXELS < 46 * 215 * 215
    config = PainExperiment.model_validate({"methods": ["F(N)"], "data": {"synthetic": {}},
                                            "protocol": {"image_size": 215}})
    assert make_algorithm("fedavg", config).client.settings.eval_batch_size == 45


def test_pooled_items_stay_items_and_give_the_same_images(pain_cohort):
    from fedcare.algorithms.training import ClientData
    from fedcare.studies.pain.cohort import FrameItems

    cohort = _cohort(load_unbc(pain_cohort))
    parts = [cohort.sessions[k][1].as_client_data() for k in (43, 80)]
    pooled = ClientData.concat(parts)  # centralized training pools the clients' sets
    assert isinstance(pooled.x, FrameItems) and len(pooled) == sum(len(p) for p in parts)
    assert pooled.x[:].equal(torch.cat([p.x[:] for p in parts]))
