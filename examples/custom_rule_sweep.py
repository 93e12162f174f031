"""Your own aggregation rule, registered once and compared with fedsafe's in a sweep.

``norm_clipped_median`` clips every update to the median update norm, then takes the
coordinate-wise median: a rule fedsafe does not ship, written as a plain function of the (n, d)
update matrix and registered with ``fedsafe.register_rule``. From then on configs name it like
any built-in rule (``robust.rule = "norm_clipped_median"``), so the sweep below compares it
with the mean and the trimmed mean under two attacks by 5 of 15 clients. From the command line, the module that
registers it is imported first::

    fedsafe --import my_rules sweep exp.toml --grid robust.rule=mean,norm_clipped_median

    python examples/custom_rule_sweep.py            # 2 attacks x 3 rules x 20 rounds
    python examples/custom_rule_sweep.py --quick    # 2 rounds (what the tests run)
"""

from __future__ import annotations

import argparse
import tempfile

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


def main(quick: bool = False) -> list[dict]:
    with tempfile.TemporaryDirectory() as out:
        records = fedsafe.sweep(
            {"rounds": 2 if quick else 20, "eval_every": 1 if quick else 5, "seed": 0,
             "data": {"name": "digits", "partition": "dirichlet", "alpha": 1.0},
             "model": {"name": "mlp", "hidden": 32}, "clients": {"num_clients": 15}},
            grid={"attack.name": ["gaussian", "sign_flip"],
                  "robust.rule": ["mean", "trimmed_mean", "norm_clipped_median"]},
            out_dir=out, overrides={"attack.f": 5},
        )
    print(f"{'attack':<10} {'rule':<20} final accuracy")
    for r in records:
        print(f"{r['attack.name']:<10} {r['robust.rule']:<20} {100 * r['final_accuracy']:.1f}%")
    return records


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 rounds")
    main(ap.parse_args().quick)
