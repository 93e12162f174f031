"""The ServerApp: where a FedAvg project had ``strategy = FedAvg(...)``, fedsafe's strategy.

Three experiments, chosen with the run config's ``experiment`` (10 clients, 5 sampled per
round, metrics rows in ``out-dir``):

- ``robust``: NNM + trimmed mean, tolerating one Byzantine client;
- ``private``: DP-FedAvg with central noise (z = 1) and its ε accounted every round;
- ``local_dp``: each client's ``dp_mod`` clips and noises its own update; the median
  aggregates (with local noise any rule may run).
"""

from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from digits_app.task import make_model
from fedsafe.flower import FedsafeStrategy

CLIENTS = {"num_clients": 10, "sampling": "fixed", "sample_size": 5}
EXPERIMENTS = {
    "robust": {"clients": CLIENTS, "robust": {"rule": "trimmed_mean", "pre": ["nnm"], "f": 1}},
    "private": {"clients": CLIENTS,
                "dp": {"enabled": True, "placement": "central", "noise_multiplier": 1.0, "clip": 2.0, "accountant": "rdp"}},
    "local_dp": {"clients": CLIENTS, "robust": {"rule": "median"},
                 "dp": {"enabled": True, "placement": "local", "noise_multiplier": 0.02, "clip": 2.0, "accountant": "rdp"}},
}

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    strategy = FedsafeStrategy(EXPERIMENTS[str(rc["experiment"])], out_dir=rc["out-dir"], fraction_evaluate=0.5)
    result = strategy.start(
        grid=grid, initial_arrays=ArrayRecord(make_model().state_dict()), num_rounds=int(rc["num-rounds"]),
    )
    last = strategy.rows[-1]
    print(f"fedsafe: round {last['round']}, epsilon {last.get('epsilon')}, "
          f"clients' evaluation {result.evaluate_metrics_clientapp.get(last['round'])}")
