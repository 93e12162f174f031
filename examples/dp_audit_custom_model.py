"""Differential privacy and an empirical audit on your own model.

DP-FedAvg (per-client clipping to 1.0, Gaussian noise multiplier 0.8 added by the server,
Poisson sampling of 20% of 100 clients) trains a small MLP of your own; dp-accounting's PLD
accountant reports the ε the run spent, and 100 canary clients (half of them never inserted)
give the one-shot empirical ε estimate of Andrew et al. beside its valid 95% lower bound. The
analytic ε bounds what any attack can learn; the audit shows how close this run's model comes.

    python examples/dp_audit_custom_model.py            # 40 rounds, about a minute on 2 cores
    python examples/dp_audit_custom_model.py --quick    # 3 rounds (what the tests run)
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import fedsafe


def main(quick: bool = False) -> dict[str, float]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10))
    exp = fedsafe.Experiment(
        model=model,
        rounds=3 if quick else 40, seed=0, eval_every=1 if quick else 10,
        data={"name": "digits"},  # the embedded dataset; pass data=(x, y) for your own
        clients={"num_clients": 100, "sampling": "poisson", "sample_rate": 0.2,
                 "algorithm": "fedavg", "local_steps": 2, "lr": 0.5, "batch_size": 8},
        server={"lr": 1.0},
        dp={"enabled": True, "clip": 1.0, "noise_multiplier": 0.8, "delta": 1e-5, "accountant": "pld"},
        audit={"canaries": 100, "unobserved": 100},
    )
    s = exp.run().summary
    print(f"final accuracy          {100 * s['final_accuracy']:.1f}%")
    print(f"epsilon (dp-accounting) {s['epsilon']:.2f} at delta {s['delta']:g}")
    print(f"audit: epsilon estimate {s['eps_est_final']:.2f}, valid 95% lower bound {s['eps_lo_valid_final']:.2f}")
    return {k: s[k] for k in ("final_accuracy", "epsilon", "eps_est_final", "eps_lo_valid_final")}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 rounds")
    main(ap.parse_args().quick)
