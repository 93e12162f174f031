"""The paper's 4-user counterexample (§3.2): one user's update has support the others lack, and a
one-record change in it is detected with certainty from the sum alone."""

from __future__ import annotations

import numpy as np
import torch

from fedsafe.privacy.inherent import counterexample_four_users


def test_counterexample_distinguisher_is_perfect_and_wf_na_removes_it():
    out = counterexample_four_users(trials=100)
    d, d_prime = out["datasets"]["D"], out["datasets"]["D_prime"]
    # the construction: users 1-3 vanish on the last quarter, user 4 does not; one record differs
    assert all(float(u[:, 6:].abs().max()) == 0.0 for u in d[:3])
    assert float(d[3][:, 6:].abs().max()) > 0
    diff = [i for i in range(4) if not torch.equal(d[i], d_prime[i])]
    assert diff == [3] and int((d[3] != d_prime[3]).any(dim=1).sum()) == 1
    assert float(out["changed"]["gradient"].norm()) <= 1.0 + 1e-12

    assert out["accuracy"] == 1.0
    assert not out["decisions"]["D"].any() and out["decisions"]["D_prime"].all()
    assert out["candidate_in_span"] is False
    assert "singular covariance, rank 7 < d=8" in out["verdict"]
    assert out["verdict"].startswith("no DP without noise")

    wf = out["wf_na"]
    assert wf["accuracy"] == 0.5  # the zero test always says "D′" once noise fills the gap
    assert np.isfinite(wf["epsilon"]) and wf["audit"].dp_possible
