"""Your own CNN on your own arrays: robust aggregation against a poisoning attack.

The arrays here are scikit-learn's handwritten digits (8x8 images), standing in for data you
hold in memory; the CNN is an ordinary ``torch.nn.Module`` (GroupNorm, not BatchNorm: clients
must not share running statistics). Twenty clients hold Dirichlet(0.5) shares of the data and
four of them are Byzantine (ALIE). The plain mean is compared with NNM + trimmed mean, the model
is saved and loaded back.

    python examples/custom_cnn.py            # 30 rounds, about half a minute on 2 cores
    python examples/custom_cnn.py --quick    # 3 rounds (what the tests run)
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn

import fedsafe


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.ReLU(), nn.MaxPool2d(2),  # 8x8 -> 4x4
            nn.Conv2d(16, 32, 3, padding=1), nn.GroupNorm(4, 32), nn.ReLU(), nn.MaxPool2d(2),  # -> 2x2
        )
        self.head = nn.Linear(32 * 2 * 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def main(quick: bool = False) -> dict[str, float]:
    torch.manual_seed(0)
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]  # (1797, 1, 8, 8) in [0, 1]
    x = (x - x.mean()) / x.std()  # your preprocessing: fedsafe uses your inputs as given
    y = digits.target

    config = {  # the same keys as a TOML file; [data] says how fedsafe splits your arrays
        "rounds": 3 if quick else 30, "seed": 0, "eval_every": 1 if quick else 5,
        "data": {"partition": "dirichlet", "alpha": 0.5},
        "clients": {"num_clients": 20, "batch_size": 32, "momentum": 0.9},
        "server": {"lr": 0.1},
        "attack": {"name": "alie", "f": 4},
    }
    results = {}
    for label, robust in [("mean", {"rule": "mean"}),
                          ("nnm + trimmed_mean", {"rule": "trimmed_mean", "pre": ["nnm"]})]:
        exp = fedsafe.Experiment(config, model=SmallCNN(), data=(x, y), robust=robust)
        result = exp.run()
        results[label] = result.summary["final_accuracy"]
        print(f"{label:>20}: final accuracy {100 * result.summary['final_accuracy']:.1f}%")

    with tempfile.TemporaryDirectory() as tmp:  # save the robust model and load it back
        result.save_model(tmp)
        model = fedsafe.load_model(tmp, model=SmallCNN())
        test = exp.data
        acc = (model(test.x_test).argmax(1) == test.y_test).float().mean().item()
        print(f"{'reloaded model':>20}: test accuracy {100 * acc:.1f}%")
        results["reloaded"] = acc
    return results


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 rounds")
    main(ap.parse_args().quick)
