"""Every problem of an experiment at once: ``fedsafe check``, and ``fedsafe run`` before it
touches its output folder.

:class:`~fedsafe.engine.federation.Federation` refuses at set-up what cannot run, one problem at
a time. :func:`check_experiment` runs the same checks side by side and keeps going past a
failure wherever the later checks do not depend on it:

1. The config: every key pydantic refuses, then every problem between sections
   (:meth:`~fedsafe.config.ExperimentConfig.cross_problems`). A refused value is set back to its
   default so that the rest can still be checked; every check that reads such a key is then
   left out, so a default never produces a problem of its own. An unknown key changes nothing.
2. ``--variant`` and ``--set`` against the file's variants, then each variant's own keys.
3. For each run (the experiment, or each selected variant), the set-up of ``Federation``:
   the data, the model, the robust pipeline, FLTrust's root dataset, the protocol's check, each
   rule's (n, f) requirement at the configured round size, the attack against the protocol and
   the data it poisons, Ray's address, the round plugins (DP's plan, the audit, inherent noise),
   and the protocol's preflight at the configured size and message dimension. If the data
   cannot be loaded, the checks that need only its shape run on the shape the dataset's files
   have (for the built-in datasets), and those that need the data itself are left out.

Each problem is one line naming its key, as :class:`~fedsafe.core.errors.ConfigError` lines do;
a variant's lines start with ``variants.NAME:`` (one line for a problem several variants share).
The datasets loaded here are kept for ``fedsafe run`` (:meth:`CheckResult.federation`), so a run
loads its data once.
"""

from __future__ import annotations

import copy
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fedsafe.config import (
    BASE_VARIANT,
    ExperimentConfig,
    _flatten,
    _validate_strict,
    apply_overrides,
    default_config_text,
    error_lines,
    parse_override,
    parse_toml,
    problem_line,
    read_toml,
    select_variants,
    validate,
    variant_raw,
)
from fedsafe.core.errors import ConfigError


@dataclass
class Validated:
    """A config validated as far as it goes: ``cfg`` with every refused value set back to its
    default (None only when even that fails), the problems, and the dotted keys set back."""

    cfg: ExperimentConfig | None
    problems: list[str]
    replaced: set[str] = field(default_factory=set)


@dataclass
class Job:
    """One run of the experiment as checked: ``prefix`` starts its lines (``variants.NAME: ``,
    or empty for the experiment itself); ``clean``: its keys had no problem."""

    name: str
    prefix: str
    cfg: ExperimentConfig
    replaced: set[str]
    clean: bool


@dataclass
class CheckResult:
    """What :func:`check_experiment` found. ``cfg`` is the experiment as ``fedsafe run`` runs
    it (variants selected), set only when there is no problem; ``name``: its name, where known
    (for the default output folder); ``warnings``: what the checks warned of."""

    problems: list[str]
    warnings: list[str] = field(default_factory=list)
    cfg: ExperimentConfig | None = None
    name: str | None = None
    jobs: list[Job] = field(default_factory=list)
    data: DataCache | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def federation(self, job_cfg: ExperimentConfig, job_dir: Path) -> Any:
        """The job's :class:`~fedsafe.engine.federation.Federation`, on the dataset the check
        loaded for it (a ``federation`` factory for :func:`fedsafe.engine.run.run_experiment`)."""
        from fedsafe.engine.federation import Federation

        data = None if self.data is None else self.data.loaded(job_cfg)
        return Federation(job_cfg, out_dir=job_dir, data=data)


# --- the config ------------------------------------------------------------------------------


def read_raw(path: Path | None, overrides: Sequence[str] = ()) -> tuple[dict[str, Any], dict[str, Any]]:
    """The raw experiment at ``path`` (the embedded default when None) with every ``--set``
    applied, and the overrides as ``{key: value}``; ConfigError lists every override that is
    malformed or cannot be applied (a file that cannot be read is one line)."""
    raw = parse_toml(default_config_text(), "default config") if path is None else read_toml(path)
    pairs: dict[str, Any] = {}
    problems: list[str] = []
    for item in overrides:
        try:
            key, value = parse_override(item)
        except ConfigError as e:
            problems.extend(e.problems)
            continue
        pairs[key] = value
    for key, value in pairs.items():
        try:
            raw = apply_overrides(raw, {key: value})
        except ConfigError as e:
            problems.extend(e.problems)
    if problems:
        raise ConfigError(problems)
    return raw, pairs


def validate_all(raw: dict[str, Any], prefix: str = "", replaced: Iterable[str] = ()) -> Validated:
    """Validate ``raw`` reporting every problem: the keys pydantic refuses (each set back to its
    default so that validation can go on) and the problems between sections that read no key
    set back (those of ``replaced`` included: set back already). Lines start with ``prefix``."""
    raw = copy.deepcopy(raw)
    problems: list[str] = []
    replaced = set(replaced)
    touched: set[str] = set()  # top-level keys changed: their later errors may be the defaults'
    for attempt in range(100):
        try:
            cfg = _validate_strict(raw, prefix, cross=False)
            break
        except ConfigError as e:  # values with no TOML form, each naming its key
            for line in e.problems:
                path = _path(line.removeprefix(prefix).split(": ", 1)[0])[:2]
                if not _remove(raw, path):
                    return Validated(None, problems + e.problems, replaced)
                replaced.add(_dotted(path))
                touched.add(str(path[0]))
                problems.append(line)
        except ValidationError as err:
            progress = False
            for e in err.errors():
                loc = tuple(e["loc"])
                lines = error_lines(e, prefix)
                if not loc:
                    return Validated(None, problems + lines, replaced)
                if attempt == 0 or str(loc[0]) not in touched:
                    problems.extend(lines)
                unknown = e["type"] == "extra_forbidden"  # removing an unknown key changes nothing
                path = loc[:2] if attempt == 0 or unknown else loc[:1]
                if not _remove(raw, path):
                    path = loc[:1]
                    if not _remove(raw, path):
                        continue
                progress = True
                if not unknown:
                    touched.add(str(loc[0]))
                    replaced.add(_dotted(path))
            if not progress:
                return Validated(None, problems, replaced)
    else:  # pragma: no cover - each attempt removes a key
        return Validated(None, problems, replaced)
    for msg, reads in cfg.cross_problems():
        if not _touches(reads, replaced):
            problems.append(problem_line(msg, "config", prefix))
    return Validated(cfg, _unique(problems), replaced)


def _path(key: str) -> tuple[str | int, ...]:
    """``a.b[0].c`` -> ("a", "b", 0, "c")."""
    out: list[str | int] = []
    for part in key.split("."):
        m = re.fullmatch(r"([^\[]*)((?:\[\d+\])*)", part)
        if m is None:
            out.append(part)
            continue
        if m.group(1):
            out.append(m.group(1))
        out.extend(int(i) for i in re.findall(r"\[(\d+)\]", m.group(2)))
    return tuple(out)


def _remove(raw: Any, path: tuple[Any, ...]) -> bool:
    """Delete ``path`` from ``raw`` (a list item counts as its list); whether it was there."""
    if not path:
        return False
    node = raw
    for i, part in enumerate(path[:-1]):
        if isinstance(part, int):  # the list itself goes
            return _remove(raw, path[:i])
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    last = path[-1]
    if isinstance(last, int):
        return _remove(raw, path[:-1])
    if not isinstance(node, dict) or last not in node:
        return False
    del node[last]
    return True


def _dotted(path: Iterable[Any]) -> str:
    return ".".join(str(p) for p in path if not isinstance(p, int))


def _touches(reads: Iterable[str], replaced: set[str]) -> bool:
    """Whether any key in ``reads`` is, holds or lies in a key of ``replaced``."""
    return any(a == b or a.startswith(b + ".") or b.startswith(a + ".") for a in reads for b in replaced)


def _unique(lines: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(lines))


# --- the experiment ----------------------------------------------------------------------------


def check_experiment(
    path: Path | None,
    overrides: Sequence[str] = (),
    variants: Sequence[str] = (),
    *,
    setup: bool = True,
    keep_data: bool = False,
    extra: Callable[[ExperimentConfig, list[Job], set[str]], list[str]] | None = None,
) -> CheckResult:
    """Every problem of the experiment ``fedsafe run [path] --set ... --variant ...`` would run
    (see the module docstring). ``setup``: also the set-up checks of each run (data, model,
    rules, protocols, plugins); ``keep_data``: keep the loaded datasets for
    :meth:`CheckResult.federation`; ``extra(cfg, jobs, replaced)``: more problem lines
    (``fedsafe check --flower``), given the experiment as selected, its runs and the keys of it
    set back to their defaults."""
    try:
        raw, pairs = read_raw(path, overrides)
    except ConfigError as e:
        return CheckResult(list(e.problems))
    base = validate_all(raw)
    problems = list(base.problems)
    result = CheckResult(problems)
    if base.cfg is None:
        return result
    if "name" not in base.replaced:
        result.name = base.cfg.name
    if "variants" in base.replaced:  # which runs there are is unknown: their set-up is not checked
        return result
    sel = _select(base.cfg, variants, pairs, problems)
    jobs: list[Job] = []
    if sel is not None and not sel.variants:
        jobs.append(Job(sel.name, "", sel, base.replaced, clean=not base.problems))
    selected = {} if sel is None else sel.variants
    inherited = set(base.problems)
    # every variant of the file is validated (`fedsafe run` loads them all); the selected ones run
    for name in [*base.cfg.variants, *(n for n in selected if n not in base.cfg.variants)]:
        prefix = f"variants.{name}: "
        try:
            merged = variant_raw(base.cfg if name in base.cfg.variants else sel, name)
        except ConfigError as e:
            problems.extend(e.problems)
            continue
        # the base's keys set back stay so, unless the variant sets them itself
        own = list(_flatten(base.cfg.variants.get(name, {})))
        kept = {k for k in base.replaced if not any(k == o or k.startswith(o + ".") for o in own)}
        v = validate_all(merged, prefix, kept)
        problems.extend(line for line in v.problems if line.removeprefix(prefix) not in inherited)
        if v.cfg is not None and name in selected:
            jobs.append(Job(name, prefix, v.cfg, v.replaced, clean=not v.problems))
    result.jobs = jobs
    cache = DataCache()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        if setup:
            found: dict[str, list[str]] = {}
            for job in jobs:
                for line in setup_problems(job.cfg, job.replaced, cache):
                    found.setdefault(line, []).append(job.prefix.removesuffix(": "))
            for line, where in found.items():
                names = [w for w in where if w]
                problems.append(f"{', '.join(names)}: {line}" if names else line)
        if extra is not None and sel is not None:
            problems.extend(extra(sel, jobs, base.replaced))
    result.warnings = _unique(str(w.message) for w in caught if issubclass(w.category, UserWarning))
    result.problems = problems = _unique(problems)
    if not problems:
        try:  # exactly what `fedsafe run` loads
            result.cfg = select_variants(validate(raw), variants, pairs)
        except ConfigError as e:  # pragma: no cover - every problem was found above
            result.problems = list(e.problems)
    if keep_data and result.ok:
        result.data = cache
    return result


def _select(
    cfg: ExperimentConfig, names: Sequence[str], pairs: dict[str, Any], problems: list[str]
) -> ExperimentConfig | None:
    """:func:`~fedsafe.config.select_variants`, its problems added to ``problems``; on a
    problem, the names that exist are checked (None: none does)."""
    try:
        return select_variants(cfg, names, pairs)
    except ConfigError as e:
        problems.extend(e.problems)
    known = dict(cfg.variants)
    chosen = [n for n in dict.fromkeys(names) if n in known or n == BASE_VARIANT] if names else list(known)
    if not chosen:
        return None
    if chosen == [BASE_VARIANT]:
        return cfg.model_copy(update={"variants": {}})
    return cfg.model_copy(update={"variants": {n: known.get(n, {}) for n in chosen}})


# --- the set-up of one run ---------------------------------------------------------------------


class DataCache:
    """Datasets loaded by the check, one per (data section, clients, seed): variants that share
    their data share one load, and ``fedsafe run`` reuses it."""

    def __init__(self) -> None:
        self._got: dict[tuple[str, int, int], tuple[Any, str | None]] = {}

    @staticmethod
    def _key(cfg: ExperimentConfig) -> tuple[str, int, int]:
        return (cfg.data.model_dump_json(), cfg.clients.num_clients, cfg.seed)

    def load(self, cfg: ExperimentConfig) -> tuple[Any, str | None]:
        """(the dataset, None) or (None, the problem), as ``Federation`` words it."""
        from fedsafe.data import loader

        key = self._key(cfg)
        if key not in self._got:
            try:
                self._got[key] = (loader.load_federated(cfg.data, cfg.clients.num_clients, cfg.seed), None)
            except (ValueError, OSError) as e:
                self._got[key] = (None, f"data: {e}")
        return self._got[key]

    def loaded(self, cfg: ExperimentConfig) -> Any:
        """The dataset loaded for ``cfg``, or None."""
        return self._got.get(self._key(cfg), (None, None))[0]


#: The input shape of each built-in dataset's files (before data.resize), and its classes:
#: what the checks that need only the shape use when the data cannot be loaded.
_IMAGE_FILES = {"digits": (1, 8, 8), "mnist": (1, 28, 28), "fashion_mnist": (1, 28, 28), "cifar10": (3, 32, 32)}


def nominal_shape(data_cfg: Any) -> tuple[tuple[int, ...], int] | None:
    """(input shape, classes) the dataset of ``data_cfg`` has once loaded, without loading it;
    None for a dataset registered by the user."""
    if data_cfg.name == "synthetic":
        return (data_cfg.synthetic_dim,), data_cfg.synthetic_classes
    shape = _IMAGE_FILES.get(data_cfg.name)
    if shape is None:
        return None
    if data_cfg.resize is not None:
        shape = (shape[0], data_cfg.resize, data_cfg.resize)
    return shape, 10


#: The keys that set the configured round size.
_ROUND_SIZE = ("clients.sampling", "clients.num_clients", "clients.sample_size", "clients.sample_rate")


class _NeedsData(Exception):
    """A plugin asked for the clients' data sizes, which are unknown (the data failed)."""


class _UnknownSizes(tuple):
    """Stands for the clients' data sizes when the data could not be loaded."""

    def _unknown(self, *args: Any) -> Any:
        raise _NeedsData

    __iter__ = __len__ = __getitem__ = __contains__ = _unknown  # type: ignore[assignment]


def setup_problems(cfg: ExperimentConfig, replaced: set[str] = frozenset(), data: DataCache | None = None) -> list[str]:
    """What :class:`~fedsafe.engine.federation.Federation` would refuse at set-up for ``cfg``
    (one run, no variants), every independent problem at once. Checks that read a key in
    ``replaced`` are left out; ``data`` caches loaded datasets."""
    from fedsafe.core.plugins import implementing, make_plugins
    from fedsafe.core.protocol import ProtocolError, make_protocol
    from fedsafe.core.randomness import RandomSource
    from fedsafe.core.streams import torch_stream
    from fedsafe.engine.federation import check_pipeline_size, preflight_protocol
    from fedsafe.models import build_model, flatten_params
    from fedsafe.robust.attacks import check_attack_protocol
    from fedsafe.robust.backdoor import make_poison
    from fedsafe.robust.pipeline import RobustPipeline

    data = data or DataCache()
    problems: list[str] = []

    def skip(*keys: str) -> bool:
        return _touches(keys, replaced)

    def attempt(what: Callable[[], Any], wrap: Callable[[Exception], list[str]], *errors: type) -> tuple[bool, Any]:
        try:
            return True, what()
        except ConfigError as e:
            problems.extend(e.problems)
        except errors as e:
            problems.extend(wrap(e))
        return False, None

    seed = cfg.seed
    data_keys = ("data", "clients.num_clients", "seed")
    dataset = None
    if not skip(*data_keys):
        dataset, problem = data.load(cfg)
        if problem is not None:
            problems.append(problem)

    # the model: on the data's shape, or the shape its files have
    shape = None
    if dataset is not None:
        shape = (dataset.input_shape, dataset.num_classes)
    elif not skip("data"):
        shape = nominal_shape(cfg.data)
    model = None
    if shape is not None and not skip("model", "seed"):
        _, model = attempt(
            lambda: build_model(cfg.model, shape[0], shape[1], generator=torch_stream(seed, "model.init")),
            lambda e: [f"model: {e}"], ValueError,
        )

    pipeline_keys = ("robust", "attack.f", "seed")
    pipeline = None
    if not skip(*pipeline_keys):
        _, pipeline = attempt(
            lambda: RobustPipeline(cfg.robust.rule, cfg.robust.params, [(p.name, p.params) for p in cfg.robust.pre],
                                   cfg.rule_f, seed),
            lambda e: [f"robust: {e}"], ValueError,
        )
    backend = None
    if model is not None:
        from fedsafe.engine.backends import make_backend
        from fedsafe.models import ParamLayout

        backend = make_backend("serial", model, ParamLayout.from_model(model))
    if pipeline is not None and pipeline.uses_server_update and dataset is not None and backend is not None \
            and not skip("clients", "zo"):
        from fedsafe.engine.clients import ClientWork

        attempt(lambda: pipeline.attach_server_data(
                    dataset, seed, lambda root, root_seed: ClientWork(cfg.clients, backend, root, root_seed, zo=cfg.zo)),
                lambda e: [str(e)], ValueError)

    protocol_keys = ("protocol", cfg.protocol, *(("attack",) if cfg.protocol == "he" else ()))
    protocol = None
    checked = False
    if not skip(*protocol_keys):
        _, protocol = attempt(lambda: make_protocol(cfg), lambda e: [f"protocol: {e}"], ValueError, ProtocolError)
    try:
        if protocol is not None and pipeline is not None:
            checked, _ = attempt(lambda: protocol.check(pipeline), lambda e: [f"protocol: {e}"], ProtocolError)
        if pipeline is not None and not skip(*_ROUND_SIZE):
            attempt(lambda: check_pipeline_size(cfg, pipeline), lambda e: [f"robust: {e}"], ValueError)
        if not skip("attack.name", "protocol"):
            name = getattr(protocol, "name", cfg.protocol)
            attempt(lambda: check_attack_protocol(cfg.attack.name, name), lambda e: [str(e)], ValueError)
        if dataset is not None and not skip("attack"):
            attempt(lambda: make_poison(cfg.attack.name, cfg.attack.params, dataset.x_train, dataset.num_classes),
                    lambda e: [str(e)], ValueError)
        if cfg.execution == "ray" and not skip("execution", "ray.address"):
            from fedsafe.engine.ray_execution import check_address

            attempt(lambda: check_address(cfg.ray.address), lambda e: [f"ray.address: {e}"], ValueError)

        # the round plugins, on the model's parameters (built on the files' shape if the data did not load)
        plugin_keys = ("dp", "audit", "inherent", "clients", "rounds", "attack.f", "seed", "secure_randomness")
        plugins = None
        if model is not None and not skip(*plugin_keys):
            sizes = tuple(len(ix) for ix in dataset.client_indices) if dataset is not None else _UnknownSizes()
            source = RandomSource.for_run(seed, cfg.secure_randomness)
            try:
                _, plugins = attempt(lambda: make_plugins(cfg, source, flatten_params(model), sizes),
                                     lambda e: [f"plugins: {e}"], ValueError)
            except _NeedsData:  # a plugin needs the clients' data, which did not load
                plugins = None

        # the protocol's preflight at the configured size, on the message dimension
        if checked and plugins is not None and not skip("zo", "clients.algorithm", "clients.gradient", *_ROUND_SIZE):
            dim = _message_dim(cfg, model, dataset, backend)
            if dim is not None:
                for p in implementing(plugins, "message_dim"):
                    dim = p.message_dim(dim)
                bind = getattr(protocol, "bind_plugins", None)
                if bind is not None:
                    bind(plugins)
                attempt(lambda: preflight_protocol(cfg, protocol, pipeline, dim), lambda e: [f"protocol: {e}"],
                        ProtocolError)
    finally:
        close = getattr(protocol, "close", None)
        if close is not None:
            close()
    return problems


def _message_dim(cfg: ExperimentConfig, model: Any, dataset: Any, backend: Any) -> int | None:
    """One client's message length for ``model`` (``ClientWork.message_dim``): from the client
    work on the data, or from the client algorithm alone when the data did not load."""
    from fedsafe.models import flatten_params

    d = flatten_params(model).numel()
    if dataset is not None:
        from fedsafe.engine.clients import ClientWork

        return ClientWork(cfg.clients, backend, dataset, cfg.seed, zo=cfg.zo).message_dim(d)
    from types import SimpleNamespace

    from fedsafe.core.clients import CLIENT_ALGORITHMS, algorithm_key

    work = SimpleNamespace(cfg=cfg.clients, zo=cfg.zo)
    try:
        algorithm = CLIENT_ALGORITHMS.entry(algorithm_key(cfg.clients.algorithm, cfg.clients.gradient)).impl()
        algorithm.setup(work)  # its own settings (zeroth-order: BAFFLE's, from [zo])
        return int(algorithm.message_dim(work, d))
    except AttributeError:  # an algorithm that needs more of its client work than this stand-in
        return None
