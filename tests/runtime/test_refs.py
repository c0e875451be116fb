"""Data references: each study's kinds travel as plain JSON and come back equal at the site that
declares them; anything else is refused there."""

import importlib
import json
import pkgutil

import numpy as np
import pytest

import fedcare.studies
from fedcare.runtime.flower.site import FactorySite
from fedcare.runtime.refs import DataRef, DataRefError, SeededSplit, Split
from fedcare.studies.facerec.data import Evaluation, FaceSite, Training
from fedcare.studies.fedhealth2.data import FedHealth2Site
from fedcare.studies.pain.cohort import PainSite, SessionFrames, TrainingSet
from fedcare.studies.privacy_audit.data import AuditSite, Shadow
from fedcare.studies.surgical.data import SurgicalSite

SITES = [PainSite, FedHealth2Site, FaceSite, SurgicalSite, AuditSite, FactorySite]
EXAMPLES = [  # (a site class, a reference it resolves, its form for people)
    (PainSite, TrainingSet(seed=5, upto=2), "train/5/2"), (PainSite, SessionFrames(3), "session/3"),
    (FedHealth2Site, SeededSplit("train", 0), "seeded/train/0"),
    (FedHealth2Site, SeededSplit("pretrain", -7), "seeded/pretrain/-7"),
    (FaceSite, Training("global"), "train/global"), (FaceSite, Evaluation("local", 2), "eval/local/2"),
    (AuditSite, SeededSplit("test", 1), "seeded/test/1"), (AuditSite, Shadow(1, 2), "shadow/1/2"),
    (SurgicalSite, Split("test"), "split/test"), (FactorySite, Split("eval"), "split/eval"),
]


@pytest.mark.parametrize("site, ref, text", EXAMPLES, ids=[text for _, _, text in EXAMPLES])
def test_a_reference_travels_as_plain_json_and_comes_back_equal_at_its_site(site, ref, text):
    plain = json.loads(json.dumps(ref.plain()))
    back = DataRef.from_plain(plain, site.data_refs)
    assert back == ref and type(back) is type(ref) and hash(back) == hash(ref)
    assert str(ref) == text


def test_every_kind_a_study_defines_is_declared_by_a_site():
    """A kind no site declares would work in process and be refused by every Flower site."""
    for module in pkgutil.walk_packages(fedcare.studies.__path__, "fedcare.studies."):
        importlib.import_module(module.name)
    kinds, todo = set(), [DataRef]
    while todo:
        for sub in todo.pop().__subclasses__():
            kinds.add(sub)
            todo.append(sub)
    declared = {k for site in SITES for k in site.data_refs}
    assert kinds <= declared | {k for k in kinds if not k.__module__.startswith("fedcare.")}, kinds - declared
    for site in SITES:  # one kind name per site: the plain form's "kind" picks the class
        assert len({k.kind for k in site.data_refs}) == len(site.data_refs), site


@pytest.mark.parametrize("plain", [
    {"kind": "session", "session": 3},  # another site's kind
    {"kind": "train", "seed": 5},  # a field missing
    {"kind": "train", "seed": 5, "upto": 2, "path": "/etc"},  # a field too many
    {"kind": "train", "seed": "5", "upto": 2},  # a string for an int
    {"kind": "train", "seed": True, "upto": 2},  # JSON's true is no int here
    "train/5/2",  # the string form a checkpoint before typed references held
    ["train", 5],
])
def test_a_site_refuses_what_is_not_one_of_its_kinds_with_exactly_its_fields(plain):
    with pytest.raises(DataRefError):
        DataRef.from_plain(plain, [TrainingSet, Split])


def test_a_reference_with_a_field_json_would_not_keep_does_not_travel():
    assert TrainingSet(np.int64(5), 2) == TrainingSet(5, 2)  # in process it is the same reference
    with pytest.raises(TypeError, match=r"TrainingSet\.seed = np\.int64\(5\): a reference's fields are int or str"):
        TrainingSet(np.int64(5), 2).plain()
