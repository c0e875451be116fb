"""Secure aggregation's protocol core (fedcare.privacy.secagg, in process; not yet wired into
runs): the server's sum equals the plain sum to fixed-point tolerance; no single masked reply
reveals its update; a client dropping out after masking still lets the round finish when at
least the threshold answer, and not below it."""

from __future__ import annotations

import numpy as np
import pytest

from fedcare.privacy.secagg import SecAggError, decode, encode, secure_sum, shamir_join, shamir_split

TOL = 6 * 2.0 ** -24  # one rounding per client


def updates(n_clients: int = 5, size: int = 1000) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(0)
    return {c: rng.normal(0, 0.1, size) for c in range(n_clients)}


def test_the_server_sum_is_the_plain_sum():
    x = updates()
    total, _ = secure_sum(x, threshold=3)
    np.testing.assert_allclose(total, sum(x.values()), atol=TOL, rtol=0)


def test_no_single_masked_reply_reveals_its_update():
    x = updates()
    _, received = secure_sum(x, threshold=3)
    for c, y in received.items():
        seen = decode(y)
        assert abs(np.corrcoef(seen, x[c])[0, 1]) < 0.1  # nothing of x left in what the server sees
        assert np.median(np.abs(seen - x[c])) > 1e3  # read as an update, it is nowhere near it
        # the masked integers spread over the whole ring, as uniform ones do
        assert abs(y.mean() / 2 ** 48 - 0.5) < 0.05


def test_a_client_dropping_after_masking_still_lets_the_round_finish():
    x = updates()
    total, received = secure_sum(x, threshold=3, drop_after_masking={1, 4})
    assert sorted(received) == [0, 2, 3]
    np.testing.assert_allclose(total, x[0] + x[2] + x[3], atol=TOL, rtol=0)


def test_below_the_threshold_the_round_cannot_be_unmasked():
    with pytest.raises(SecAggError, match="fewer than the threshold 4"):
        secure_sum(updates(), threshold=4, drop_after_masking={0, 1})


def test_shamir_rebuilds_from_any_threshold_shares_only():
    secret = 123456789 ** 5
    shares = shamir_split(secret, list(range(6)), 3)
    assert shamir_join({h: shares[h] for h in (0, 2, 5)}) == secret
    assert shamir_join({h: shares[h] for h in (1, 3, 4)}) == secret
    assert shamir_join({h: shares[h] for h in (1, 3)}) != secret


def test_fixed_point_round_trip():
    v = np.array([-3.5, 0.0, 1e-6, 12345.678])
    np.testing.assert_allclose(decode(encode(v)), v, atol=2.0 ** -24)
