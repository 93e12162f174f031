"""Ray execution against a local Ray instance the tests start and stop."""

import shutil
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from test_federation import close_rows, small, strip  # noqa: E402

from fedsafe.engine.federation import Federation  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def test_ray_equals_serial(local_ray):
    over = {"rounds": 3, "clients.num_clients": 6, "ray.clients_per_task": 2}
    serial = Federation(small(execution="serial", **over))
    on_ray = Federation(small(execution="ray", **over))
    serial.run(), on_ray.run()
    assert strip(serial.rows) == strip(on_ray.rows)  # inner serial backend: identical numbers


class _TanhNet(torch.nn.Module):
    """A user's module the workers cannot build from a config: shipped from the driver."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 16)
        self.b = torch.nn.Linear(16, 10)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x.flatten(1))))


def _smoothed(logits, y):
    return torch.nn.functional.cross_entropy(logits, y, label_smoothing=0.1)


def test_ray_runs_a_users_module_and_loss_as_serial(local_ray):
    over = {"rounds": 2, "clients.num_clients": 4}
    torch.manual_seed(0)
    net = _TanhNet()
    serial = Federation(small(execution="serial", **over), model=net, loss=_smoothed)
    on_ray = Federation(small(execution="ray", **over), model=net, loss=_smoothed)
    serial.run(), on_ray.run()
    assert strip(serial.rows) == strip(on_ray.rows)
    assert torch.equal(serial.state.params, on_ray.state.params)


def test_killed_worker_is_a_recorded_dropout(local_ray):
    cfg = small(execution="ray", rounds=3, **{"clients.num_clients": 5, "ray.fail": [[2, 1]]})
    fed = Federation(cfg)
    fed.run()
    assert [r["dropouts"] for r in fed.rows] == [0, 1, 0]
    assert [r.get("skipped") for r in fed.rows] == [None, None, None]
    assert fed.rows[-1]["test_accuracy"] is not None


def test_secagg_client_parties_on_ray_actors(local_ray):
    import numpy as np

    from fedsafe.protocols.secagg import SecAggConfig
    from fedsafe.protocols.secagg.ray_parties import RayClientProxy, ray_client_factory
    from fedsafe.protocols.secagg.session import run_round, seeded_randomness

    rng = np.random.default_rng(0)
    inputs = {c: rng.uniform(-0.5, 0.5, 40) for c in range(5)}
    cfg = SecAggConfig(clip=1.0)
    keep: dict = {}
    local = run_round(inputs, cfg, drop_at={3: "mask"}, randomness=seeded_randomness(1, 1))
    remote = run_round(inputs, cfg, drop_at={3: "mask"}, randomness=seeded_randomness(1, 1),
                       client_factory=ray_client_factory(), keep=keep)
    assert np.array_equal(local.total, remote.total) and local.survivors == remote.survivors
    # The driver holds only proxies: no client vector or secret lives in this process.
    assert all(isinstance(c, RayClientProxy) and not hasattr(c, "_vector") for c in keep["clients"].values())


def test_secagg_run_with_ray_parties_equals_local_parties(local_ray):
    import torch

    over = {"rounds": 2, "protocol": "secagg", "clients.num_clients": 5, "secagg": {"clip": 1.0}}
    local = Federation(small(execution="serial", **over))
    on_ray = Federation(small(execution="serial", **over, **{"secagg.placement": "ray"}))
    local.run(), on_ray.run()
    assert torch.equal(local.state.params, on_ray.state.params)


def test_tee_accelerators_on_ray_actors(local_ray):
    import torch

    over = {"rounds": 2, "protocol": "tee", "clients.num_clients": 6, "robust.rule": "multi_krum",
            "attack.name": "alie", "attack.f": 1, "tee": {"clip": 10.0, "processes": False}}
    local = Federation(small(execution="serial", **over))
    on_ray = Federation(small(execution="serial", **over, **{"tee.accelerators": "ray"}))
    local.run(), on_ray.run()
    # Exact decoding: the selected set and the model do not depend on where distances were computed.
    assert torch.equal(local.state.params, on_ray.state.params)
    assert on_ray.rows[-1]["mi_bound_bits"] > 0


def test_zeroth_order_fedsgd_on_ray_equals_serial(local_ray):
    # Messages are K scalars, not d parameters; momentum and weight decay act on the decoded step.
    # A task evaluates its clients' perturbed losses in one batched call, as the serial engine
    # does for the whole round: with the round in one task the numbers are identical; split into
    # tasks of 2 the batched calls have other shapes and agree to float rounding (about 1e-6 in
    # the parameters here), as loss_differences_many's rows agree with one client's call.
    over = {"rounds": 2, "clients.num_clients": 5, "clients.gradient": "zeroth_order",
            "clients.momentum": 0.5, "clients.weight_decay": 1e-3, "zo.k": 12, "zo.sigma": 1e-3}
    serial = Federation(small(execution="serial", **over))
    whole = Federation(small(execution="ray", **over, **{"ray.clients_per_task": 5}))
    split = Federation(small(execution="ray", **over, **{"ray.clients_per_task": 2}))
    serial.run(), whole.run(), split.run()
    assert strip(serial.rows) == strip(whole.rows)
    assert torch.equal(serial.state.params, whole.state.params)
    close_rows(serial.rows, split.rows, rtol=1e-5)
    assert torch.allclose(serial.state.params, split.state.params, rtol=0, atol=1e-5)


def test_workers_need_no_data_files(local_ray, tmp_path, monkeypatch):
    # The driver loads the files once and ships the arrays through the object store: the
    # directory is gone before any task runs, and the run still equals the serial one.
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "data"))
    from test_data_idx import make_mnist

    make_mnist(tmp_path / "mnist", n_train=40, n_test=10, size=8)
    over = {"rounds": 2, "clients.num_clients": 4, "ray.clients_per_task": 2,
            "data": {"name": "mnist", "path": str(tmp_path / "mnist"), "partition": "iid"}}
    serial = Federation(small(execution="serial", **over))
    on_ray = Federation(small(execution="ray", **over))
    shutil.rmtree(tmp_path / "mnist")
    serial.run(), on_ray.run()
    assert [r["dropouts"] for r in on_ray.rows] == [0, 0]
    assert strip(serial.rows) == strip(on_ray.rows)


def test_hung_task_times_out_into_a_recorded_dropout(local_ray):
    over = {"rounds": 2, "clients.num_clients": 4, "ray.clients_per_task": 2}
    Federation(small(execution="ray", **{**over, "rounds": 1})).run()  # warm the worker processes
    fed = Federation(small(execution="ray", **over, **{"ray.hang": [[2, 3]], "ray.task_timeout": 2.0}))
    fed.run()
    assert [r["dropouts"] for r in fed.rows] == [0, 2]  # the task of clients 2 and 3
    assert [r.get("skipped") for r in fed.rows] == [None, None]


def test_with_a_timeout_tasks_in_flight_default_to_the_cluster_slots(local_ray):
    # The timeout clock starts at submission: a queued task must not time out waiting for a CPU.
    cap = lambda **over: Federation(small(execution="ray", **over)).work._in_flight_cap(10)  # noqa: E731
    assert cap() == 10  # no timeout: everything in flight
    assert cap(**{"ray.task_timeout": 5.0}) == 2  # the fixture's 2 CPUs, 1 per task
    assert cap(**{"ray.task_timeout": 5.0, "ray.num_cpus": 0.5}) == 4
    assert cap(**{"ray.task_timeout": 5.0, "ray.max_concurrent": 3}) == 3


def test_ray_client_address_needs_the_client_extra(monkeypatch):
    import importlib.util

    from fedsafe.config import ConfigError
    from fedsafe.engine import ray_execution

    real = importlib.util.find_spec
    monkeypatch.setattr(ray_execution.importlib.util, "find_spec", lambda n, *a: None if n == "grpc" else real(n, *a))
    with pytest.raises(ConfigError, match=r"ray\.address.*ray://.*fedsafe\[ray\]"):
        Federation(small(execution="ray", **{"ray.address": "ray://127.0.0.1:10001"}))


def test_inherent_clients_on_ray_equal_serial(local_ray):
    # The driver fixes σ² (calibrated from the config); tasks receive it with their clients.
    over = {"rounds": 2, "clients.num_clients": 4, "ray.clients_per_task": 2, "clients.algorithm": "inherent",
            "inherent": {"row": "gsgd+wf_na", "sigma2": 0.5, "max_records": 8},
            "secure_randomness": False}  # seeded noise: two runs can only be equal if they draw the same
    serial = Federation(small(execution="serial", **over))
    on_ray = Federation(small(execution="ray", **over))
    serial.run(), on_ray.run()
    assert [r["dropouts"] for r in on_ray.rows] == [0, 0]
    assert strip(serial.rows) == strip(on_ray.rows)
