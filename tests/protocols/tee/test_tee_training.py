"""A digits run under ALIE: TEE-offloaded Multi-Krum trains exactly like plaintext Multi-Krum."""

import torch

from fedsafe.config import validate
from fedsafe.engine.federation import Federation
from fedsafe.protocols.tee import COST_KEYS, TEEConfig, TEEProtocol

RAW = {
    "seed": 5,
    "rounds": 8,
    "eval_every": 4,
    "data": {"name": "digits", "partition": "dirichlet", "alpha": 1.0},
    "model": {"name": "mlp", "hidden": 16},
    "clients": {"num_clients": 12, "algorithm": "dsgd", "batch_size": 16, "momentum": 0.9},
    "server": {"lr": 0.5},
    "attack": {"name": "alie", "f": 3, "params": {"z": 10.0}},
    "robust": {"rule": "multi_krum"},
}


def test_tee_run_matches_plaintext_multi_krum():
    plain = Federation(validate(RAW))
    plain.run()
    tee = Federation(validate(RAW))
    # the lead wires protocol = "tee" into the config; here the protocol is swapped in directly
    tee.protocol = TEEProtocol(TEEConfig(clip=10.0, noise_ratio=1e6, processes=False))
    tee.protocol.check(tee.pipeline)
    with tee.protocol:
        tee.run()
    assert [r["test_accuracy"] for r in tee.rows] == [r["test_accuracy"] for r in plain.rows]
    assert torch.equal(tee.state.params, plain.state.params)  # same selections every round
    accuracy = [r["test_accuracy"] for r in plain.rows if r["test_accuracy"] is not None]
    assert accuracy[-1] > accuracy[0] > 0.15  # learning (chance is 0.1), with the same accuracy
    for row in tee.rows:
        assert set(COST_KEYS) <= set(row) and row["clipped"] == 0 and row["selected"] == 9
        assert 0 < row["mi_bound_bits"] < 1e-2 and row["decode_error_estimate"] < 1e-9
