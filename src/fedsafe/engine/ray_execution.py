"""``execution = "ray"``: honest clients' local work as Ray tasks, on one machine or a cluster.

The driver loads the dataset once and puts its training arrays into the object store once
(``ray.put``, at start-up); each round the global model goes in once more. Clients are split
into tasks of ``clients_per_task``; a task builds the model and its client code once per worker
process (cached by the config's text and the dataset's object) from the shipped arrays, so
workers never read ``data.path`` and need no dataset files, and runs the same client code as
the in-process backends (``inner`` = serial or vectorized) on its clients. Client state (dsgd
momentum) travels with the task and comes back with the result, so the driver stays the single
owner of all state and a run is reproducible and resumable exactly as with the other backends:
with ``inner = "serial"`` the numbers are identical to ``execution = "serial"``.

A task that raises or whose worker dies is retried ``retries`` times; after that its clients
count as dropouts for the round (their messages are absent, their state is unchanged). A task
still running ``task_timeout`` seconds after it was submitted is cancelled (its worker process
is killed; a cancelled task is not retried) and its clients count as dropouts too. The clock
starts at submission, so with a timeout the tasks in flight default to what the cluster can run
at once (its CPUs / ``num_cpus``, and GPUs / ``num_gpus``): a task waiting for a free CPU does
not time out for want of one.

``address = "ray://host:port"`` connects through Ray Client, which needs ``ray[client]``
(grpcio; the ``ray`` extra of fedsafe includes it).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import time
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedsafe.config import ConfigError
from fedsafe.core.clients import LocalResult
from fedsafe.data import FederatedDataset
from fedsafe.engine.clients import ClientWork

_WORKER_CACHE: dict[tuple[str, str], ClientWork] = {}
_HANG_SECONDS = 60.0  # fault injection: far beyond a test's timeout, yet a broken timeout fails, not hangs


def _worker_work(cfg_toml: str, data_box: list[Any]) -> ClientWork:
    """This worker's client code for the experiment; ``data_box`` holds the object refs of the
    dataset and of ``(model, loss)`` inside a list, so that Ray does not fetch them for every
    task, only on a miss. ``model`` is a user's own module (None: built from the config) and
    ``loss`` a user's loss (None: cross-entropy), shipped by Ray's serializer from the driver."""
    import ray

    key = (cfg_toml, data_box[0].hex(), data_box[1].hex())
    work = _WORKER_CACHE.get(key)
    if work is None:
        from fedsafe.config import parse_toml, validate
        from fedsafe.core.streams import torch_stream
        from fedsafe.engine.backends import make_backend
        from fedsafe.models import ParamLayout, build_model

        cfg = validate(parse_toml(cfg_toml))
        data = ray.get(data_box[0])
        model, loss = ray.get(data_box[1])
        if model is None:
            model = build_model(cfg.model, data.input_shape, data.num_classes, generator=torch_stream(cfg.seed, "model.init"))
        backend = make_backend(cfg.ray.inner, model, ParamLayout.from_model(model), loss)
        work = ClientWork(cfg.clients, backend, data, cfg.seed, zo=cfg.zo)
        _WORKER_CACHE.clear()  # one experiment per worker at a time
        _WORKER_CACHE[key] = work
    return work


def _client_task(
    cfg_toml: str,
    data_box: list[Any],
    round_: int,
    params: Tensor,
    ids: np.ndarray,
    momentum: Tensor | None,
    poison: Any,
    shared: Any,
    faults: dict[str, list[list[int]]],
    threads: int,
) -> tuple[Tensor, Tensor, Tensor | None]:
    torch.set_num_threads(threads)
    mine = set(map(int, ids))
    if any(r == round_ and int(c) in mine for r, c in faults["fail"]):
        os._exit(1)  # fault injection: the worker process dies mid-round
    if any(r == round_ and int(c) in mine for r, c in faults["hang"]):
        time.sleep(_HANG_SECONDS)  # fault injection: the task hangs
    work = _worker_work(cfg_toml, data_box)
    work.algorithm.load_shared_state(shared)  # what the driver's algorithm was given (inherent: σ²)
    res = work.run(round_, params, ids, momentum, poison)
    return res.updates, res.losses, res.momentum


def _pickle_by_value(*objects: Any) -> None:
    """Have Ray serialize the modules defining a user's model class and loss by value: workers
    then need not import them (a class in a script, a notebook or a test file that is not on
    the workers' path would otherwise fail to load there, and every task would fail)."""
    import sys

    from ray import cloudpickle

    names = set()
    for obj in objects:
        if isinstance(obj, torch.nn.Module):  # every layer's class, wherever it is defined
            names |= {type(m).__module__ for m in obj.modules()}
        elif obj is not None:
            names.add(getattr(obj, "__module__", None))
    for name in names:
        if not name or name == "__main__" or name.split(".")[0] in ("fedsafe", "torch", "builtins"):
            continue  # __main__ is serialized by value already; the rest workers import
        module = sys.modules.get(name)
        if module is not None:
            cloudpickle.register_pickle_by_value(module)


def check_address(address: str) -> None:
    """Refuse, naming ``ray.address``, what Ray itself would refuse less clearly."""
    if importlib.util.find_spec("ray") is None:
        raise ConfigError(["execution = 'ray' needs Ray: pip install 'fedsafe[ray]'"])
    if address.startswith("ray://") and importlib.util.find_spec("grpc") is None:
        raise ConfigError([
            f"ray.address = {address!r} connects through Ray Client, which needs the ray[client] "
            "extra (grpcio): pip install 'fedsafe[ray]' (it includes ray[client]); or run fedsafe "
            "on the cluster's head node with ray.address = 'auto'"
        ])


def training_only(data: FederatedDataset) -> FederatedDataset:
    """``data`` without its test split: what client tasks need (the driver evaluates)."""
    return dataclasses.replace(data, x_test=data.x_test[:0], y_test=data.y_test[:0])


class RayClientWork(ClientWork):
    """ClientWork whose ``run`` fans clients out to Ray tasks."""

    def __init__(self, cfg, backend, data, seed: int, experiment, *, ship_model: bool = False) -> None:
        """``ship_model``: send the backend's module to the workers (a user's own module, which
        they cannot build from the config)."""
        super().__init__(cfg, backend, data, seed, zo=experiment.zo)
        rc = experiment.ray
        check_address(rc.address)
        import ray

        self.rc = rc
        self._cfg_toml = experiment.to_toml()
        self._started = False
        if not ray.is_initialized():
            if rc.address == "local":
                ray.init(num_cpus=rc.local_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
            elif rc.address.startswith("ray://"):
                ray.init(address=rc.address, log_to_driver=False)
            else:
                ray.init(address=rc.address, include_dashboard=False, log_to_driver=False, configure_logging=False)
            self._started = True
        self._ray = ray
        custom = backend.model if ship_model else None
        if ship_model:
            _pickle_by_value(custom, backend.loss_fn)
        self._data_box = [ray.put(training_only(data)), ray.put((custom, backend.loss_fn))]
        self._task = ray.remote(_client_task).options(
            num_cpus=rc.num_cpus, num_gpus=rc.num_gpus, max_retries=rc.retries, retry_exceptions=rc.retries > 0
        )

    def _in_flight_cap(self, tasks: int) -> int:
        if self.rc.max_concurrent is not None:
            return self.rc.max_concurrent
        if self.rc.task_timeout is None:
            return tasks
        total = self._ray.cluster_resources()
        slots = int(total.get("CPU", 0) // self.rc.num_cpus)
        if self.rc.num_gpus:
            slots = min(slots, int(total.get("GPU", 0) // self.rc.num_gpus))
        return max(1, slots)

    def run(self, round_, params, ids, momentum=None, poison=None) -> LocalResult:
        ray = self._ray
        params_ref = ray.put(params)
        step = self.rc.clients_per_task
        chunks = [np.arange(i, min(i + step, len(ids))) for i in range(0, len(ids), step)]
        threads = max(1, int(self.rc.num_cpus))
        faults = {"fail": [list(p) for p in self.rc.fail], "hang": [list(p) for p in self.rc.hang]}
        timeout = self.rc.task_timeout
        cap = self._in_flight_cap(len(chunks))
        pending: dict[Any, tuple[int, float]] = {}  # ref -> (chunk, deadline)
        results: dict[int, tuple[Tensor, Tensor, Tensor | None] | None] = {}
        queue = list(enumerate(chunks))
        while queue or pending:
            while queue and len(pending) < cap:
                k, rows = queue.pop(0)
                mom = None if momentum is None else momentum[torch.from_numpy(rows)]
                ref = self._task.remote(
                    self._cfg_toml, self._data_box, round_, params_ref, ids[rows], mom, poison, self.algorithm.shared_state(), faults,
                    threads,
                )
                pending[ref] = (k, float("inf") if timeout is None else time.monotonic() + timeout)
            wait_s = None if timeout is None else max(0.0, min(dl for _, dl in pending.values()) - time.monotonic())
            done, _ = ray.wait(list(pending), num_returns=1, timeout=wait_s)
            for ref in done:
                k, _ = pending.pop(ref)
                try:
                    results[k] = ray.get(ref)
                except (ray.exceptions.RayError, OSError):
                    results[k] = None
            now = time.monotonic()
            for ref in [r for r, (_, dl) in pending.items() if dl <= now]:
                k, _ = pending.pop(ref)
                ray.cancel(ref, force=True)  # kills the hung worker; a cancelled task is not retried
                results[k] = None
        width = self.message_dim(params.numel())
        updates = params.new_zeros((len(ids), width))
        losses = params.new_full((len(ids),), float("nan"))
        new_mom = None if momentum is None else momentum.clone()
        ok = np.ones(len(ids), dtype=bool)
        for k, rows in enumerate(chunks):
            r = results[k]
            if r is None:
                ok[rows] = False
                continue
            idx = torch.from_numpy(rows)
            updates[idx], losses[idx] = r[0], r[1]
            if new_mom is not None:
                new_mom[idx] = r[2]
        return LocalResult(updates, losses, new_mom, survivors=ok)

    def close(self) -> None:
        if self._started and self._ray.is_initialized():
            self._ray.shutdown()
            self._started = False
