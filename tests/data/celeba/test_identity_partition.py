"""The Hess thesis's three partitions of CelebA identities into clients (equal, lognormal as Table
4.2, attribute filters as Table 4.1) and the 70/10/20 split per identity."""

from __future__ import annotations

import numpy as np
import pytest

from fedcare.data.celeba import identity_partition as ip
from fedcare.data.celeba.reader import ATTRIBUTES, load_celeba
from fedcare.data.common import DataError

from support.celeba_layout import write_layout


def _population(n_people=1800, per=6, seed=1) -> np.ndarray:
    counts = np.random.default_rng(seed).integers(2, 2 * per, size=n_people)
    return np.repeat(np.arange(1, n_people + 1) * 3, counts)  # ids 3, 6, 9, ... (not contiguous)


def test_split_sizes_are_70_10_20_per_identity():
    assert ip.split_sizes(20) == (14, 2, 4) and ip.split_sizes(10) == (7, 1, 2)
    assert ip.split_sizes(3) == (1, 1, 1) and ip.split_sizes(2) == (1, 0, 1) and ip.split_sizes(1) == (1, 0, 0)
    assert all(sum(ip.split_sizes(n)) == n and ip.split_sizes(n)[0] >= 1 for n in range(1, 60))


def test_lognormal_partition_has_the_shape_of_table_4_2():
    ids = _population()
    part = ip.lognormal_partition(ids, seed=0)
    counts = np.array([len(c.identities) for c in part.clients])
    assert len(part.clients) == 20 and counts.sum() == 1500 and counts.min() >= 1
    assert counts.max() >= 50 * counts.min()  # heavy quantity skew (Table 4.2: 171x in images)
    assert part.info["identities_per_client"] == counts.tolist()
    s = np.array(part.info["S"])
    raw = ip.largest_remainder(1500, s)
    assert np.abs(counts - raw).sum() <= 2 * (raw == 0).sum()  # only the empty clients were topped up
    people = np.concatenate([c.identities for c in part.clients])
    assert len(people) == len(set(people.tolist())) == 1500  # whole identities, each on one client
    for c in part.clients:  # every sample of a client's person is on that client, split 70/10/20
        for person in c.identities[:3].tolist():
            on = np.flatnonzero(ids == person)
            assert sorted(on.tolist()) == sorted(set(on) & set(c.samples.tolist()))
            got = tuple(int(np.isin(on, split).sum()) for split in (c.train, c.val, c.test))
            assert got == ip.split_sizes(len(on))
    again = ip.lognormal_partition(ids, seed=0)
    assert all(np.array_equal(a.train, b.train) for a, b in zip(part.clients, again.clients))
    other = ip.lognormal_partition(ids, seed=1)
    assert [len(c.identities) for c in other.clients] != counts.tolist()
    assert ip.largest_remainder(10, [1, 1, 1]).tolist() == [4, 3, 3]
    assert ip.largest_remainder(7, [0.5, 0.25, 0.25]).tolist() == [3, 2, 2]
    assert ip.largest_remainder(10, [0.55, 0.3, 0.15]).tolist() == [6, 3, 1]  # tie: lower index


def test_equal_partition_and_unseen_clients():
    ids = _population()
    part = ip.equal_partition(ids, seed=2)
    assert [len(c.identities) for c in part.clients] == [75] * 20
    assert [c.client for c in part.unseen_clients()] == list(ip.UNSEEN_CLIENTS) == [16, 17, 18, 19, 20]
    assert [c.client for c in part.training_clients()] == list(range(1, 16))
    train = part.federated_train_indices()
    assert set(train) == set(range(1, 16))
    used = np.concatenate([s for c in part.training_clients() for s in (c.train, c.val, c.test)])
    for c in part.unseen_clients():
        assert len(c.train) and not np.isin(c.samples, used).any()
        assert not np.isin(ids[c.samples], ids[used]).any()  # unseen persons never trained on
    # global labels: client 1 gets 0..74, client 2 75..149, ...
    c2 = part.client(2)
    assert sorted(set(part.global_labels(c2.train, ids).tolist())) == list(range(75, 150))
    assert sorted(set(c2.local_labels(c2.train, ids).tolist())) == list(range(75))
    # selection: the first 1500 eligible identities of the seeded order
    chosen = ip.select_identities(ids, 1500, 2)
    order = ip.selection_order(ids, 2)
    assert chosen.tolist() == [p for p in order.tolist() if (ids == p).sum() >= 3][:1500]
    with pytest.raises(ValueError, match="identities"):
        ip.equal_partition(ids[:50], seed=0)


def test_every_table_4_1_filter_takes_exactly_its_images(tmp_path):
    """One image per filter that matches it, and per filter key one image that differs in that key
    only; written as a real attribute file and read back."""
    specs = ip.load_attribute_clients()
    assert [s.client for s in specs] == list(range(1, 21)) and sum(s.size for s in specs) == 21153
    rows, expect = [], {}
    number = 1
    for spec in specs:
        base = np.zeros(40, bool)
        for key, value in spec.filter.items():
            base[ATTRIBUTES.index(key)] = value
        rows.append((f"{number:06d}.jpg", number, base))
        expect[spec.client] = number
        number += 1
        for key in spec.filter:
            flipped = base.copy()
            flipped[ATTRIBUTES.index(key)] = not flipped[ATTRIBUTES.index(key)]
            rows.append((f"{number:06d}.jpg", number, flipped))
            number += 1
    ds = load_celeba(write_layout(tmp_path / "filters", rows))
    for spec in specs:
        own = [i for i, (_, person, _) in enumerate(rows) if expect[spec.client] <= person
               < expect[spec.client] + 1 + len(spec.filter)]
        single = ip.attribute_partition(ds.identities[own], ds.attributes[own], clients=[spec],
                                        min_images_per_identity=1)
        taken = [int(ds.identities[own][i]) for i in single.clients[0].samples]
        assert taken == [expect[spec.client]], spec
    # spot checks against the thesis table
    by = {s.client: s.filter for s in specs}
    assert by[2] == {"Male": True, "Eyeglasses": True, "Wearing_Hat": False, "Young": False, "Gray_Hair": True}
    assert by[5] == {"Eyeglasses": False, "Wearing_Hat": True}
    assert by[11]["Black_Hair"] is False and by[12]["Blond_Hair"] is False and by[13]["Brown_Hair"] is True
    assert by[17]["No_Beard"] is False and by[17]["Mustache"] is False and by[18]["Bushy_Eyebrows"] is False
    assert by[15] == {"Male": False, "Eyeglasses": False, "Wearing_Hat": False, "Young": True, "Oval_Face": False,
                      "Wearing_Lipstick": True, "Rosy_Cheeks": True}


def test_attribute_deduplication_serves_the_scarcest_filter_first():
    broad = ip.AttributeClient(1, 100, {"Male": True})
    narrow = ip.AttributeClient(2, 100, {"Male": True, "Bald": True})
    other = ip.AttributeClient(16, 3, {"Male": False, "Smiling": True})
    attrs = np.zeros((40, 40), bool)
    attrs[:30, ATTRIBUTES.index("Male")] = True
    attrs[:10, ATTRIBUTES.index("Bald")] = True
    attrs[32:38, ATTRIBUTES.index("Smiling")] = True
    ids = np.repeat(np.arange(20), 2)  # persons of two images each
    part = ip.attribute_partition(ids, attrs, clients=[broad, narrow, other], seed=0)
    assert part.info["service_order"] == [16, 2, 1]
    c1, c2, c16 = part.client(1), part.client(2), part.client(16)
    assert c2.samples.tolist() == list(range(10))  # every bald man goes to the narrow filter
    assert c1.samples.tolist() == list(range(10, 30))  # the broad one gets what is left
    assert len(c16.samples) == 4 and c16.target == 3 and c16.unseen  # whole persons: overshoots by < 1 person
    all_samples = np.concatenate([c.samples for c in part.clients])
    assert len(all_samples) == len(set(all_samples.tolist()))  # no image on two clients
    assert part.client(2).candidates == 10 and part.client(1).candidates == 30


def test_a_filter_with_an_unknown_attribute_is_an_error_naming_the_key(tmp_path):
    bad = tmp_path / "clients.toml"
    bad.write_text('[[client]]\nclient = 1\nsize = 10\nfilter = { Male = true, Glasses = true }\n')
    with pytest.raises(DataError, match=r"clients\.toml.*client 1.*'Glasses' is not a CelebA attribute"):
        ip.load_attribute_clients(bad)
    bad.write_text('[[client]]\nclient = 1\nsize = 10\nfilter = { Male = "yes" }\n')
    with pytest.raises(DataError, match=r"filter\.Male must be true or false"):
        ip.load_attribute_clients(bad)
