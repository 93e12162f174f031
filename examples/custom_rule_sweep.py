"""Your own aggregation rule, registered once and compared with fedsafe's in a sweep.

``norm_clipped_median`` clips every update to the median update norm, then takes the
coordinate-wise median: a rule fedsafe does not ship, written as a plain function of the (n, d)
update matrix and registered with ``fedsafe.register_rule``. From then on configs name it like
any built-in rule (``robust.rule = "norm_clipped_median"``), so the sweeps below compare it with
the plain mean and the built-in trimmed mean, with 5 of 15 clients Byzantine, under two attacks
that wreck the mean: Gaussian noise (std 200) and ALIE with z = 10 (the honest mean plus ten
standard deviations). Both robust rules must beat the mean under both; the script prints each
rule's margin over the mean (20 rounds, seeds 0-1: the mean 28-52%, the robust rules 85-93%;
--quick, 8 rounds: the mean 18-41%, the robust rules 60-74%). From the command line, the module
that registers the rule is imported first::

    fedsafe --import my_rules sweep exp.toml --grid robust.rule=mean,norm_clipped_median

    python examples/custom_rule_sweep.py            # 2 attacks x 3 rules x 20 rounds
    python examples/custom_rule_sweep.py --quick    # 8 rounds (what the tests run)
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

import fedsafe
from fedsafe import RequirementError


@fedsafe.register_rule("norm_clipped_median", replace=True)
def norm_clipped_median(updates: torch.Tensor, *, f: int) -> torch.Tensor:
    """clip every update to the median norm, then the coordinate-wise median (n > 2f)"""
    n = updates.shape[0]
    if not 2 * f < n:
        raise RequirementError(f"norm_clipped_median needs n > 2f, got n={n}, f={f}")
    norms = torch.linalg.vector_norm(updates, dim=1, keepdim=True)
    tau = norms.median()
    clipped = updates * torch.where(norms > tau, tau / norms, torch.ones_like(norms))
    return clipped.median(dim=0).values


RULES = ["mean", "trimmed_mean", "norm_clipped_median"]
ATTACKS = {"gaussian": {}, "alie": {"z": 10.0}}  # attack -> its parameters


def main(quick: bool = False, seed: int = 0) -> list[dict]:
    config = {"rounds": 8 if quick else 20, "eval_every": 4 if quick else 5, "seed": seed,
              "data": {"name": "digits", "partition": "iid"},
              "model": {"name": "mlp", "hidden": 32}, "clients": {"num_clients": 15},
              "server": {"lr": 1.0}}
    records = []
    with tempfile.TemporaryDirectory() as out:
        for attack, params in ATTACKS.items():  # one sweep per attack: each has its own parameters
            cells = fedsafe.sweep(config, grid={"robust.rule": RULES}, out_dir=Path(out) / attack,
                                  attack={"name": attack, "f": 5, "params": params})
            records += [{"attack.name": attack, **r} for r in cells]
    print(f"{'attack':<10} {'rule':<20} final accuracy")
    for r in records:
        print(f"{r['attack.name']:<10} {r['robust.rule']:<20} {100 * r['final_accuracy']:.1f}%")
    for attack in ATTACKS:
        acc = {r["robust.rule"]: r["final_accuracy"] for r in records if r["attack.name"] == attack}
        margins = ", ".join(f"{rule} {100 * (acc[rule] - acc['mean']):+.1f}" for rule in RULES[1:])
        print(f"under {attack}, points over the mean: {margins}")
    return records


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 rounds")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    main(args.quick, args.seed)
