"""`fedcare.runtime.sites.without_paths`: what a site's error may say about its disk when it
leaves the site (none of its paths)."""

import pytest

from fedcare.runtime.sites import without_paths


@pytest.mark.parametrize("text, expected", [
    ("site 'hospital-b': data directory /data/UNBC-McMaster does not exist",
     "site 'hospital-b': data directory <a path at the site> does not exist"),
    ("[Errno 2] No such file or directory: '/srv/fedcare/state/run-1f/client-43.pt'",
     "[Errno 2] No such file or directory: '<a path at the site>'"),
    ("--auth-key ~/keys/hospital-a: readable by others", "--auth-key <a path at the site>: readable by others"),
    ("C:\\data\\unbc: no Images folder", "<a path at the site>: no Images folder"),
    ("frames (/data/u/Images/042-ll042) missing", "frames (<a path at the site>) missing"),
])
def test_absolute_paths_are_taken_out(text, expected):
    assert without_paths(text) == expected


@pytest.mark.parametrize("text", [
    "only 1/2 sites answered; PSPI>=1 in 3/4 frames", "see https://flower.ai/docs/framework/ref-api.html",
    "split/train and split/eval", "client 43: unknown data reference split/val",
])
def test_what_is_no_path_stays(text):
    assert without_paths(text) == text
