"""fedsafe's Python API: every mechanism of the ``fedsafe`` command on your own model and data.

Ten lines train a user's module with a robust rule against an attack::

    import torch
    import fedsafe

    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    exp = fedsafe.Experiment(
        rounds=20, model=net, data=(x, y),          # your module, your tensors
        clients={"num_clients": 20}, attack={"name": "alie", "f": 4},
        robust={"rule": "trimmed_mean", "pre": ["nnm"]},
    )
    result = exp.run()
    df = result.to_pandas()                          # one row per round
    trained = result.model                           # a torch.nn.Module

What goes in:

* the experiment: a TOML file, a dict, an :class:`~fedsafe.config.ExperimentConfig`, or
  nothing (the defaults), with keyword sections merged on top (``rounds=5``,
  ``robust={"rule": "median"}``: dicts merge key by key) and ``overrides`` with the
  command's dotted keys (``{"dp.noise_multiplier": 1.1}``). Everything is validated as the
  command validates a TOML file: :class:`~fedsafe.core.errors.ConfigError` lists every problem;
* ``model``: any ``torch.nn.Module`` that ``torch.func.functional_call`` can run (checked by
  :func:`fedsafe.models.check_model`). Its initial weights are drawn again from the run's
  ``seed`` (:func:`fedsafe.models.seed_parameters`), so the same seed gives the same run
  whatever state torch's global RNG was in when you built the module; ``model_init="module"``
  keeps the module's own weights instead (a pretrained model), as does a module with a
  parameterised part fedsafe cannot initialise (a warning names it);
* ``data``: a :class:`~fedsafe.data.FederatedDataset`, or what :func:`federated_data` takes
  (``(x, y)`` tensors or arrays, a ``torch.utils.data.Dataset``, a Hugging Face dataset), split
  over ``clients.num_clients`` by the config's ``data.partition``, or by your own
  ``client_indices`` (one index list per client);
* ``loss``: ``loss(logits, labels) -> scalar`` (the batch mean) instead of cross-entropy;
* ``callbacks``: functions called with each round's metrics row (:class:`TensorBoard` logs them).

Every subsystem works with a user's module where its math allows: robust rules, attacks, DP
and its accounting, secure aggregation, SABLE (HE), the enclave (TEE), audits, zeroth-order
clients and Ray operate on the flat parameter vector, whatever the architecture. What cannot
work is refused before round 1 with the reason (:func:`fedsafe.models.check_model`: BatchNorm
running statistics, frozen or non-float32 parameters, logits of the wrong shape; the protocols'
own checks, e.g. the enclave needs at least as many parameters as clients).

Extension points that also work from TOML once registered (``fedsafe --import your_module run
exp.toml`` imports the module that registers them): :func:`register_rule`,
:func:`register_preaggregator`, :func:`register_attack`, :func:`register_dataset`.
"""

from __future__ import annotations

import copy
import inspect
import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from torch import Tensor, nn

from fedsafe.config import ExperimentConfig, apply_overrides, read_toml, validate, variant_config, warn_renamed_keys
from fedsafe.core.errors import ConfigError
from fedsafe.core.plugins import Plugin
from fedsafe.core.registry import Registry
from fedsafe.core.streams import torch_stream
from fedsafe.data import FederatedDataset
from fedsafe.data.user import federated_data, register_dataset
from fedsafe.engine.federation import Federation
from fedsafe.models.custom import check_model
from fedsafe.models.initialization import seed_parameters, uninitialisable
from fedsafe.models.saved import load_trained
from fedsafe.robust.aggregators import AGGREGATORS
from fedsafe.robust.attacks import ATTACKS, LABEL_TRANSFORMS
from fedsafe.robust.preaggregators import PREAGGREGATORS

__all__ = [
    "Experiment",
    "Result",
    "TensorBoard",
    "federated_data",
    "load_model",
    "register_attack",
    "register_dataset",
    "register_preaggregator",
    "register_rule",
    "sweep",
]

Callback = Callable[[dict[str, Any]], Any]


# --- the experiment -------------------------------------------------------------------------


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` merged in: tables (dicts) key by key, other values replaced."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value) if isinstance(value, (dict, list)) else value
    return out


def raw_config(config: Any) -> dict[str, Any]:
    """The raw (unvalidated) dict of an experiment given as None (the defaults), an
    ExperimentConfig, a TOML path or a mapping; ConfigError for a missing file."""
    if config is None:
        return {}
    if isinstance(config, ExperimentConfig):
        return config.to_dict()
    if isinstance(config, (str, Path)):
        path = Path(config)
        if not path.is_file():
            raise ConfigError([f"config: no such TOML file: {path}"])
        return read_toml(path)
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config))
    raise TypeError(f"config must be a TOML path, a dict or an ExperimentConfig, got {type(config).__name__}")


class Experiment:
    """One federated experiment, built from a config and, optionally, your own model, data and
    loss (module docstring). Everything is validated here, before anything runs.

    ``config``: a TOML path, a dict, an ``ExperimentConfig`` or None (the defaults);
    ``**sections``: top-level keys and sections merged on top (``rounds=5``,
    ``robust={"rule": "median"}``); ``overrides``: dotted keys as ``fedsafe run --set`` takes;
    ``variant``: for a config with ``[variants]``, the one to run (``"base"``: the file
    without them). ``model`` and ``data`` given as dicts are the config's ``[model]`` and
    ``[data]`` sections; otherwise they are your own module and data. ``data`` / ``test_data`` / ``client_indices``: your data (see
    :func:`federated_data`; a ``FederatedDataset`` or your own ``client_indices`` split sets
    ``clients.num_clients`` from it unless the config names a number); ``model``, ``loss``,
    ``plugins`` (extra :class:`~fedsafe.core.plugins.Plugin` round hooks).

    ``model_init``: where your module's initial weights come from. ``"seed"`` (the default):
    drawn from the run's seed, the stream fedsafe's own models use
    (:func:`fedsafe.models.seed_parameters`: Linear, Conv and GroupNorm as fedsafe draws them,
    any other layer by its own ``reset_parameters()`` under a seeded RNG), so two runs with
    the same seed start from the same weights however the module was constructed. If a part
    of the module holds parameters and has no ``reset_parameters()``
    (:func:`fedsafe.models.uninitialisable`), the module's own weights are kept and a
    ``UserWarning`` says so: seed torch (``torch.manual_seed``) before building it to repeat a
    run. ``"module"``: always the module's own weights (a pretrained model to fine-tune).
    Either way your object is not modified."""

    def __init__(
        self,
        config: str | Path | Mapping[str, Any] | ExperimentConfig | None = None,
        *,
        model: nn.Module | None = None,
        data: Any = None,
        test_data: Any = None,
        client_indices: Sequence[Sequence[int]] | None = None,
        loss: Callable[[Tensor, Tensor], Tensor] | None = None,
        variant: str | None = None,
        overrides: Mapping[str, Any] | None = None,
        plugins: Sequence[Plugin] = (),
        model_init: Literal["seed", "module"] = "seed",
        **sections: Any,
    ) -> None:
        # `data` and `model` double as config sections: a dict is the [data] / [model] table
        from fedsafe.data.user import is_hf_dataset

        if isinstance(data, Mapping) and not is_hf_dataset(data):
            sections, data = {**sections, "data": data}, None
        if isinstance(model, Mapping):
            sections, model = {**sections, "model": model}, None
        raw = _merge(raw_config(config), sections)
        if overrides:
            raw = apply_overrides(raw, dict(overrides))
        # renamed keys warn where they enter (a TOML path warned as it was read)
        warn_renamed_keys(_merge({} if isinstance(config, (str, Path, ExperimentConfig)) else raw_config(config), sections))
        if overrides:
            warn_renamed_keys(apply_overrides({}, dict(overrides)))
        given = isinstance(data, FederatedDataset) and data.num_clients or (len(client_indices) if client_indices is not None else None)
        if given and "num_clients" not in raw.get("clients", {}):
            raw = _merge(raw, {"clients": {"num_clients": given}})
        cfg = validate(raw)
        if cfg.variants:
            if variant is None:
                raise ConfigError([
                    f"variants: this config has variants ({', '.join(cfg.variants)}); an Experiment runs one: "
                    "pass variant='NAME' (or 'base' for the config without them)"
                ])
            if variant != "base" and variant not in cfg.variants:
                raise ConfigError([f"variant: unknown variant {variant!r}; valid: base, {', '.join(cfg.variants)}"])
            cfg = variant_config(cfg, variant) if variant != "base" else cfg.model_copy(update={"variants": {}})
        elif variant not in (None, "base"):
            raise ConfigError([f"variant: {variant!r} given, but the config has no [variants]"])
        if data is None and (test_data is not None or client_indices is not None):
            raise ConfigError(["data: test_data and client_indices go with data=... (your training data)"])
        self.config: ExperimentConfig = cfg
        self.model = model
        self.loss = loss
        self.plugins = tuple(plugins)
        self._data: FederatedDataset | None = data if isinstance(data, FederatedDataset) else None
        if data is not None and self._data is None:
            self._data = self._split(data, test_data, client_indices)
        if loss is not None and not callable(loss):
            raise ConfigError([f"loss: must be a function loss(logits, labels) -> scalar, got {type(loss).__name__}"])
        if model_init not in ("seed", "module"):
            raise ConfigError([f"model_init: must be 'seed' or 'module', got {model_init!r}"])
        self.model_init = model_init
        if model is not None:  # refused now rather than at run(); protocols check at run()
            try:
                check_model(model, self.data.input_shape, self.data.num_classes)
            except ValueError as e:
                raise ConfigError([f"model: {e}"]) from None
            missing = uninitialisable(model) if model_init == "seed" else []
            if missing:
                self.model_init = "module"
                warnings.warn(
                    f"model {type(model).__name__}: fedsafe cannot initialise {', '.join(missing)} (parameters "
                    "but no reset_parameters()), so the run starts from the module's own weights and `seed` does "
                    "not set them: call torch.manual_seed before building the module to repeat a run, or pass "
                    "model_init='module' to say that this is intended",
                    UserWarning, stacklevel=2,
                )

    def _initial_model(self, seed: int) -> nn.Module | None:
        """The module a federation of this experiment trains: a copy of yours with its
        weights drawn from ``seed`` (``model_init="seed"``), or yours as it is."""
        if self.model is None or self.model_init == "module":
            return self.model
        return seed_parameters(copy.deepcopy(self.model), torch_stream(seed, "model.init"))

    def _split(self, data: Any, test_data: Any, client_indices: Any) -> FederatedDataset:
        from fedsafe.data.loader import _partition_params

        d = self.config.data
        try:
            return federated_data(
                data, test_data, num_clients=None if client_indices is not None else self.config.clients.num_clients,
                client_indices=client_indices, partition_name=d.partition, partition_params=_partition_params(d),
                test_fraction=d.test_fraction, seed=self.config.seed,
            )
        except (TypeError, ValueError) as e:
            raise ConfigError([f"data: {e}"]) from None

    @property
    def data(self) -> FederatedDataset:
        """The federated dataset the experiment trains on (yours, or the config's, loaded)."""
        if self._data is None:
            from fedsafe.data import load_federated

            self._data = load_federated(self.config.data, self.config.clients.num_clients, self.config.seed)
        return self._data

    def federation(self, out_dir: Path | None = None) -> Federation:
        """A fresh :class:`~fedsafe.engine.federation.Federation` of this experiment, for
        round-by-round control (``run_round()``); call its ``close()`` when done."""
        return Federation(
            self.config, out_dir=out_dir, data=self._data, model=self._initial_model(self.config.seed),
            loss=self.loss, plugins=self.plugins,
        )

    def run(
        self,
        out_dir: str | Path | None = None,
        *,
        callbacks: Iterable[Callback] = (),
        overwrite: bool = False,
        resume: bool = False,
    ) -> Result:
        """Run every round and return the :class:`Result`.

        ``callbacks``: each is called as ``callback(row)`` after every round with that round's
        metrics row (a dict), then, if it has one, its ``close()`` at the end. ``out_dir``:
        also write the run directory the command writes (``config.toml``, ``metrics.jsonl``,
        checkpoints, ``summary.json``, ``model.pt``); ``overwrite`` replaces an earlier fedsafe
        run there, ``resume`` continues it from its last checkpoint (pass the same model and
        data again). Without ``out_dir`` nothing is written."""
        callbacks = list(callbacks)
        for cb in callbacks:
            if not callable(cb):
                raise TypeError(f"callbacks: {cb!r} is not callable (a callback is a function of the round's row)")

        def on_round(row: dict[str, Any]) -> None:
            for cb in callbacks:
                cb(row)

        made: list[Federation] = []
        try:
            if out_dir is None:
                if resume:
                    raise ValueError("resume needs the out_dir of the run to continue")
                fed = self.federation()
                made.append(fed)
                summary = fed.run(on_round)
            else:
                from fedsafe.engine.run import run_experiment

                def make(job_cfg: ExperimentConfig, job_dir: Path) -> Federation:
                    fed = Federation(
                        job_cfg, out_dir=job_dir, data=self._data, model=self._initial_model(job_cfg.seed),
                        loss=self.loss, plugins=self.plugins,
                    )
                    made.append(fed)
                    return fed

                summaries = run_experiment(
                    self.config, Path(out_dir), resume=resume, overwrite=overwrite, quiet=True,
                    on_round=lambda _name, row: on_round(row), federation=make,
                )
                summary = next(iter(summaries.values()))
                if not made:  # a resumed run that had already finished
                    raise ValueError(f"{out_dir}: this run has already finished; nothing to resume")
                fed = made[0]
        finally:
            for cb in callbacks:
                close = getattr(cb, "close", None)
                if callable(close):
                    close()
        return Result(self.config, list(fed.rows), summary, fed)


class Result:
    """What a run leaves: ``rows`` (one metrics dict per round, as in ``metrics.jsonl``),
    ``summary`` (as ``summary.json``), ``config``, and the trained model."""

    def __init__(self, config: ExperimentConfig, rows: list[dict[str, Any]], summary: dict[str, Any], fed: Federation):
        self.config = config
        self.rows = rows
        self.summary = summary
        self.federation = fed

    @property
    def model(self) -> nn.Module:
        """The trained model (the moving average with ``server.ema``) as a new module in eval
        mode, of the same class as the one trained."""
        fed = self.federation
        params = fed.state.params if fed.ema is None else fed.ema.value
        net = copy.deepcopy(fed.model)
        fed.layout.load_into(net, params)
        return net.eval()

    def to_pandas(self):
        """The rows as a ``pandas.DataFrame`` (pandas is the optional extra ``fedsafe[pandas]``)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("Result.to_pandas needs pandas: pip install 'fedsafe[pandas]'") from None
        return pd.DataFrame(self.rows)

    def save_model(self, out_dir: str | Path) -> Path:
        """Write ``model.pt`` and ``model.json`` into ``out_dir`` (created if needed); load it
        back with :func:`load_model`."""
        path = Path(out_dir)
        path.mkdir(parents=True, exist_ok=True)
        return self.federation.save_model(path)

    def __repr__(self) -> str:
        acc = self.summary.get("final_accuracy")
        shown = "n/a" if acc is None else f"{100 * acc:.1f}%"
        return f"Result({self.config.name!r}, rounds={self.summary.get('rounds')}, final_accuracy={shown})"


def sweep(
    config: str | Path | Mapping[str, Any] | ExperimentConfig | None = None,
    grid: Mapping[str, Sequence[Any]] | None = None,
    out_dir: str | Path = "runs/sweep",
    *,
    seeds: int = 1,
    jobs: int = 1,
    overrides: Mapping[str, Any] | None = None,
    **sections: Any,
) -> list[dict[str, Any]]:
    """Run a grid of experiments, as ``fedsafe sweep``: ``grid`` maps dotted keys to the values
    to try (``{"robust.rule": ["mean", "my_rule"], "attack.f": [0, 2]}``), every cell ``seeds``
    times (seeds s, s+1, ...), ``jobs`` cells in parallel processes; finished cells under
    ``out_dir`` are reused. Returns one record per cell (the grid's values, mean and sd of the
    final accuracy over seeds; ``pandas.DataFrame(records)`` loads them) and writes
    ``sweep.csv``. Config as for :class:`Experiment`. Cells are built from the config alone,
    so rules, attacks and datasets you registered work (worker processes inherit them), while
    a model or data object does not: loop over :class:`Experiment` for those."""
    from fedsafe.engine.sweep import run_sweep

    if not grid:
        raise ValueError("sweep: grid must map at least one dotted key to a list of values")
    bad = [k for k, v in grid.items() if isinstance(v, (str, bytes)) or not isinstance(v, Sequence) or not v]
    if bad:
        raise ValueError(f"sweep: grid values must be non-empty lists; check {', '.join(bad)}")
    raw = _merge(raw_config(config), sections)
    if overrides:
        raw = apply_overrides(raw, dict(overrides))
    return run_sweep(raw, {k: list(v) for k, v in grid.items()}, Path(out_dir), jobs=jobs, seeds=seeds)


def load_model(path: str | Path, model: nn.Module | None = None) -> nn.Module:
    """The trained module saved in ``path`` (a run directory or :meth:`Result.save_model`'s);
    for a run of your own module, pass an instance of it as ``model`` to load the weights
    into (:func:`fedsafe.models.load_trained`)."""
    return load_trained(path, model)


# --- callbacks -----------------------------------------------------------------------------


class TensorBoard:
    """A callback that logs every numeric metric of each round to TensorBoard
    (``torch.utils.tensorboard``; the ``tensorboard`` package is the optional extra
    ``fedsafe[tensorboard]``): scalar ``KEY`` at step ``round``, under ``log_dir``. Values that
    are None, NaN or not numbers (a skipped round's reason) are not logged."""

    def __init__(self, log_dir: str | Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ImportError("TensorBoard logging needs tensorboard: pip install 'fedsafe[tensorboard]'") from None
        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(log_dir=str(self.log_dir))

    def __call__(self, row: dict[str, Any]) -> None:
        step = int(row["round"])
        for key, value in row.items():
            if key == "round" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isfinite(value):
                self._writer.add_scalar(key, float(value), step)

    def close(self) -> None:
        """Flush and close the event file (called by :meth:`Experiment.run` at the end)."""
        self._writer.flush()
        self._writer.close()


# --- registration --------------------------------------------------------------------------

_BUILTIN = {id(r): frozenset(r.names()) for r in (AGGREGATORS, PREAGGREGATORS, ATTACKS)}


def _register(registry: Registry, what: str, name: str, fn: Callable[..., Any], replace: bool, needs: str) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_{what}: name must be a non-empty string, got {name!r}")
    if not callable(fn):
        raise TypeError(f"register_{what}({name!r}): expected a function, got {type(fn).__name__}")
    params = inspect.signature(fn).parameters
    if needs not in params or params[needs].kind is not inspect.Parameter.KEYWORD_ONLY:
        raise TypeError(f"register_{what}({name!r}): the function must take the keyword-only parameter {needs!r} (after *)")
    for p in params.values():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            raise TypeError(f"register_{what}({name!r}): name each parameter (no **kwargs), so configs are checked")
    if name in registry:
        if name in _BUILTIN[id(registry)]:
            raise ValueError(f"{registry.kind} {name!r} is built in; register yours under another name")
        if not replace:
            raise ValueError(f"{registry.kind} {name!r} is already registered; pass replace=True to overwrite it")
        registry.unregister(name)
        if registry is ATTACKS:
            LABEL_TRANSFORMS.pop(name, None)
    registry.register(name)(fn)


def register_rule(name: str, fn: Callable[..., Tensor] | None = None, *, replace: bool = False):
    """Register an aggregation rule (decorator, or called with ``fn``): ``fn(updates, *, f,
    **params) -> Tensor[d]`` of an ``(n, d)`` tensor of updates and the number ``f`` of
    Byzantine updates it must tolerate; its other keyword-only parameters are set in
    ``robust.params`` and checked by name. Then ``robust.rule = "name"`` uses it (plain
    protocol; a rule may also take ``previous``, the last aggregate or None). Raise
    :class:`fedsafe.core.errors.RequirementError` when n and f do not meet the rule's
    requirement. ``replace``: overwrite your earlier registration of ``name``."""

    def deco(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
        _register(AGGREGATORS, "rule", name, fn, replace, "f")
        return fn

    return deco if fn is None else deco(fn)


def register_preaggregator(name: str, fn: Callable[..., Tensor] | None = None, *, replace: bool = False):
    """Register a pre-aggregator: ``fn(updates, *, f, **params) -> Tensor[n', d]`` (may also
    take ``generator``, the round's seeded ``torch.Generator``); ``robust.pre = ["name"]``."""

    def deco(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
        _register(PREAGGREGATORS, "preaggregator", name, fn, replace, "f")
        return fn

    return deco if fn is None else deco(fn)


def register_attack(
    name: str,
    fn: Callable[..., Tensor] | None = None,
    *,
    label_transform: Callable[[Tensor, int], Tensor] | None = None,
    replace: bool = False,
):
    """Register a Byzantine attack: ``fn(honest, *, ctx, **params) -> Tensor[ctx.f, d]``, the
    Byzantine updates from the ``(n_h, d)`` honest ones and the round's
    :class:`~fedsafe.robust.attacks.AttackContext` (``ctx.f``, ``ctx.aggregate`` the server's
    pipeline, ``ctx.generator``, ``ctx.own_updates``, ``ctx.state``). With ``label_transform``
    (``(labels, num_classes) -> labels``), a data-poisoning attack: the Byzantine clients train
    on transformed labels and ``ctx.own_updates`` holds their updates. ``attack.name = "name"``
    uses it, ``attack.params`` its keyword parameters."""

    def deco(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
        if label_transform is not None and not callable(label_transform):
            raise TypeError(f"register_attack({name!r}): label_transform must be a function (labels, num_classes) -> labels")
        _register(ATTACKS, "attack", name, fn, replace, "ctx")
        if label_transform is not None:
            LABEL_TRANSFORMS[name] = label_transform
        return fn

    return deco if fn is None else deco(fn)
