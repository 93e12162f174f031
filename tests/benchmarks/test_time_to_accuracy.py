"""benchmarks/time_to_accuracy.py: its hand-written loop computes what fedsafe's engine does.

Given fedsafe's own minibatches (``draw_batches``, the same seed), the hand-written FedAvg and
Robust-DSGD rounds (a torch loop over clients; ALIE and the trimmed mean written with ``std``
and ``sort``) must give fedsafe's model after each round, up to float rounding (summation
order, and ALIE's standard deviation, which fedsafe takes in float64). The data is the
script's synthetic stand-in in mnist.pkl.gz's format, so no MNIST is needed. The script's
``--quick`` run is covered by ``test_benchmarks_quick.py`` (every script in the folder)."""

from __future__ import annotations

import importlib.util
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsafe.engine.clients import draw_batches
from fedsafe.engine.federation import Federation

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "time_to_accuracy.py"


def load_script():
    if "time_to_accuracy" not in sys.modules:
        spec = importlib.util.spec_from_file_location("time_to_accuracy", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules["time_to_accuracy"] = module
        spec.loader.exec_module(module)
    return sys.modules["time_to_accuracy"]


@pytest.fixture(scope="module")
def standin(tmp_path_factory) -> Path:
    tta = load_script()
    return tta.write_standin(tmp_path_factory.mktemp("mnist") / "mnist.pkl.gz", n_train=300, n_val=60, n_test=100)


def fedsafe_batches(fed: Federation):
    """The hand-written loop's batches hook: fedsafe's draw for (round, client, step)."""
    seed, parts, size = fed.cfg.seed, fed.data.client_indices, fed.cfg.clients.batch_size

    def batches(round_: int, client: int, steps: int) -> list[torch.Tensor]:
        return [torch.from_numpy(draw_batches(seed, round_, s, np.array([client]), parts, size)[0])
                for s in range(steps)]

    return batches


@pytest.mark.parametrize("workload", ["fedavg", "robust_dsgd"])
def test_the_hand_written_loop_matches_fedsafe_round_by_round(workload: str, standin: Path) -> None:
    tta = load_script()
    cfg = tta.fedsafe_config(workload, clients=8, f=2, seed=3, data_path=str(standin), eval_every=1)
    fed = Federation(cfg)
    hand = tta.HandWritten(workload, fed, batches=fedsafe_batches(fed))
    assert torch.equal(hand.flat_params(), fed.state.params)  # the same initial weights
    if workload == "robust_dsgd":
        assert len(hand.byzantine) == 2 and set(hand.byzantine) == set(fed.byzantine)
    for _ in range(2):
        fed.run_round()
        hand.run_round()
        torch.testing.assert_close(hand.flat_params(), fed.state.params, rtol=1e-4, atol=2e-6)
    # the hand-written evaluation is fedsafe's accuracy on the same test set
    assert hand.accuracy() == pytest.approx(fed.evaluate()[1], abs=1.5 / len(fed.data.y_test))
    fed.close()


def test_the_hand_written_robust_rule_and_attack_are_the_textbook_ones() -> None:
    """The naive ALIE + trimmed mean of the hand-written round, against numpy on one matrix."""
    tta = load_script()
    rng = np.random.default_rng(0)
    honest = rng.normal(size=(7, 5)).astype(np.float32)
    n, f = 9, 2
    s = n // 2 + 1 - f
    z = statistics.NormalDist().inv_cdf((n - s) / n)
    bad = honest.astype(np.float64).mean(0) + z * honest.astype(np.float64).std(0)
    rows = np.vstack([honest, np.repeat(bad[None], f, 0)])
    want = np.sort(rows, axis=0)[f : n - f].mean(0)

    class Stub:  # only what _robust_round reads besides the model
        pass

    h = Stub()
    h.params = [torch.nn.Parameter(torch.zeros(5))]
    h.model = lambda x: x  # unused: no honest client trains here
    h.honest, h.n, h.f = [], n, f
    h.momentum = torch.from_numpy(honest)
    h.server_lr, h.wd, h.beta = 1.0, 0.0, 0.0
    tta.HandWritten._robust_round(h)
    np.testing.assert_allclose(-h.params[0].detach().numpy(), want, rtol=1e-5, atol=1e-6)
