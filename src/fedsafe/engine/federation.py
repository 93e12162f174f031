"""The federation loop: the round of docs/architecture.md, one call of :meth:`Federation.run_round` per round.

    sample clients → honest local work → [fedsafe.engine.round: client transform → Byzantine
    attack → protocol.aggregate(messages, rule) → decode to a parameter-space direction → server
    optimizer step → model stage (CRFL)] → evaluate → observers → metrics row → checkpoint

The bracketed stages are :func:`fedsafe.engine.round.aggregate_and_step`, run from the
:class:`~fedsafe.engine.round.RoundPlan` this class resolves once at set-up (the Flower strategy
runs the same stages); this class owns what is around them: sampling, the clients' work and
momentum, the attack's inputs, evaluation, metrics and checkpoints.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call

from fedsafe.config import ExperimentConfig, uses_privacy_noise
from fedsafe.core.errors import CheckpointError, ConfigError, DivergedError, RequirementError
from fedsafe.core.plugins import RoundPlugin, implementing, make_plugins
from fedsafe.core.protocol import ProtocolError, make_protocol
from fedsafe.core.randomness import RandomSource, privacy_stamp
from fedsafe.core.streams import torch_stream
from fedsafe.core.types import Messages, RoundContext
from fedsafe.data import FederatedDataset, load_federated
from fedsafe.engine.backends import LossFn, describe, make_backend
from fedsafe.engine.clients import ClientWork
from fedsafe.engine.metrics import MetricsWriter, summarize, warn_at_chance
from fedsafe.engine.round import (
    aggregate_and_step,
    end_round,
    finish_step,
    plugin_summary,
    release_empty,
    resolve_plan,
)
from fedsafe.engine.sampling import byzantine_ids, sample_clients
from fedsafe.engine.server_optimizer import ServerAdam, ServerSGD
from fedsafe.engine.state import (
    CHECKPOINT,
    ClientRows,
    FederationState,
    load_checkpoint,
    run_identity,
    save_checkpoint,
)
from fedsafe.models import ParamLayout, build_model, check_model, flatten_params
from fedsafe.robust.attacks import ATTACKS, AttackContext, check_attack_protocol
from fedsafe.robust.backdoor import attack_success_rate, make_poison
from fedsafe.robust.pipeline import RobustPipeline


def check_pipeline_size(cfg: ExperimentConfig, pipeline: RobustPipeline) -> None:
    """Run the pipeline on a dummy round of the configured size to surface n/f violations
    at config time (Poisson sampling varies n: violations then skip the round)."""
    c = cfg.clients
    n = c.round_size
    if n is None:
        return
    try:
        pipeline.check_size(n)
    except ValueError as e:
        raise ConfigError([f"robust: {e} (with {n} participants per round)"]) from None


def preflight_protocol(cfg: ExperimentConfig, protocol: Any, pipeline: RobustPipeline, dim: int) -> None:
    """The protocol's config-time check for rounds of the configured size with messages of
    ``dim`` coordinates (HE: do 128-bit-secure parameters exist? TEE: N <= d?), so a run that
    could only skip every round is refused before it starts. Under Poisson sampling the size
    varies: the check then runs on the expected size."""
    preflight = getattr(protocol, "preflight", None)
    if preflight is None:
        return
    c = cfg.clients
    n = c.round_size
    if n is None:
        n = max(1, round(c.num_clients * c.sample_rate))
    try:
        preflight(n, pipeline, dim=dim)
    except ProtocolError as e:
        raise ConfigError([f"protocol: {e}"]) from None


#: The most bytes of per-client state a run may come to hold (dsgd's client momentum, FoolsGold's
#: histories): such state is kept only for the clients seen, but over a run those can be the
#: whole population, so a config whose bound exceeds this is refused at set-up.
MAX_CLIENT_STATE_BYTES = 8 * 2**30


def clients_seen_bound(cfg: ExperimentConfig) -> int:
    """The most distinct clients a run can hold per-client state for: the population, or fewer
    when ``rounds`` rounds of the largest likely sample cannot reach it (Poisson: the expected
    sample qN plus 6 standard deviations, plus one)."""
    c = cfg.clients
    per_round = c.round_size
    if per_round is None:
        m = c.num_clients * c.sample_rate
        per_round = math.ceil(m + 6 * math.sqrt(m * (1 - c.sample_rate)) + 1)
    return min(c.num_clients, cfg.rounds * per_round)


def check_client_state(cfg: ExperimentConfig, *, momentum_dim: int | None, history_dim: int | None) -> None:
    """Refuse, naming the settings, a run whose per-client state could exceed
    :data:`MAX_CLIENT_STATE_BYTES`: ``momentum_dim`` float32 numbers per client seen (dsgd's
    momentum), ``history_dim`` float64 numbers per client seen (FoolsGold's histories)."""
    seen = clients_seen_bound(cfg)
    c, limit = cfg.clients, MAX_CLIENT_STATE_BYTES / 2**30
    why = (
        f"up to {seen:,} clients (clients.num_clients = {c.num_clients:,}, rounds = {cfg.rounds}, "
        f"clients.sampling = {c.sampling!r})"
    )
    problems = []
    if momentum_dim and seen * momentum_dim * 4 > MAX_CLIENT_STATE_BYTES:
        problems.append(
            f"clients: dsgd keeps a momentum row of {momentum_dim:,} float32 for every client it has seen, "
            f"{why}: {seen * momentum_dim * 4 / 2**30:.1f} GiB, over the {limit:g} GiB limit; set "
            "clients.momentum = 0 (no client state) or clients.algorithm = 'fedavg', or lower clients.num_clients or rounds"
        )
    if history_dim and seen * history_dim * 8 > MAX_CLIENT_STATE_BYTES:
        problems.append(
            f"robust: {cfg.robust.rule} keeps a history of {history_dim:,} float64 for every client it has seen, "
            f"{why}: {seen * history_dim * 8 / 2**30:.1f} GiB, over the {limit:g} GiB limit; use a rule "
            "without client histories, or lower clients.num_clients or rounds"
        )
    if problems:
        raise ConfigError(problems)


class _Skip(Exception):
    """The round cannot update the model (the reason goes into the metrics row)."""


class Federation:
    """One experiment's federation: data, model, clients, protocol and server, run round by
    round (:meth:`run_round`, :meth:`run`). Everything that can be refused is refused in the
    constructor, before round 1 (``ConfigError`` naming the section).

    ``data``: a :class:`~fedsafe.data.FederatedDataset` to use instead of loading ``cfg.data``;
    ``model``: a ``torch.nn.Module`` to train instead of building ``cfg.model`` (checked and
    deep-copied by :func:`fedsafe.models.check_model`; its own initial weights are used);
    ``loss``: ``loss(logits, labels) -> scalar`` (the batch mean) instead of cross-entropy,
    for training and the reported test loss; ``plugins``: round plugins run after the
    registered ones. The Python API (:class:`fedsafe.Experiment`) builds on this class.

    ``client_work(cfg, backend, data)``: builds the client work instead of ``execution``'s (a
    :class:`ClientWork`); one whose ``remote_clients`` is true runs the plugins' client-side
    transforms on the clients themselves (``fedsafe.flower``: on the SuperNodes), so the engine
    then calls each plugin's ``observe_honest`` instead of ``transform_honest``. ``protocol``:
    the protocol object instead of ``make_protocol(cfg)``.
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        *,
        out_dir: Path | None = None,
        plugins: Sequence[RoundPlugin] = (),
        data: FederatedDataset | None = None,
        model: torch.nn.Module | None = None,
        loss: LossFn | None = None,
        client_work: Callable[..., ClientWork] | None = None,
        protocol: Any = None,
    ) -> None:
        self.cfg = cfg
        self.out_dir = None if out_dir is None else Path(out_dir)
        seed = cfg.seed
        try:
            self.data = data or load_federated(cfg.data, cfg.clients.num_clients, seed)
        except (ValueError, OSError) as e:
            raise ConfigError([f"data: {e}"]) from None
        if self.data.num_clients != cfg.clients.num_clients:
            raise ConfigError([
                f"clients.num_clients = {cfg.clients.num_clients} but the dataset given is split over "
                f"{self.data.num_clients} clients"
            ])
        if loss is not None and not callable(loss):
            raise ConfigError([f"loss: must be a function loss(logits, labels) -> scalar, got {type(loss).__name__}"])
        self.loss_fn = loss
        self.custom_model = model is not None
        try:
            if model is not None:
                self.model = check_model(model, self.data.input_shape, self.data.num_classes)
            else:
                self.model = build_model(
                    cfg.model, self.data.input_shape, self.data.num_classes,
                    generator=torch_stream(seed, "model.init"),
                )
        except ValueError as e:
            raise ConfigError([f"model: {e}"]) from None
        self.layout = ParamLayout.from_model(self.model)
        if client_work is not None:
            self.backend = make_backend("serial", self.model, self.layout, loss)
            self.work = client_work(cfg, self.backend, self.data)
        elif cfg.execution == "ray":
            from fedsafe.engine.ray_execution import RayClientWork

            self.backend = make_backend(cfg.ray.inner, self.model, self.layout, loss)
            self.work = RayClientWork(cfg.clients, self.backend, self.data, seed, cfg, ship_model=model is not None)
        else:
            self.backend = make_backend(cfg.execution, self.model, self.layout, loss)
            self.work = ClientWork(cfg.clients, self.backend, self.data, seed, zo=cfg.zo)

        try:
            self.pipeline = RobustPipeline(
                cfg.robust.rule,
                cfg.robust.params,
                [(p.name, p.params) for p in cfg.robust.pre],
                cfg.rule_f,
                seed,
            )
        except ValueError as e:
            raise ConfigError([f"robust: {e}"]) from None
        try:  # a rule that computes on the server's own data (FLTrust's root dataset) gets it now
            self.pipeline.attach_server_data(
                self.data, seed, lambda root, root_seed: ClientWork(cfg.clients, self.backend, root, root_seed, zo=cfg.zo)
            )
        except ValueError as e:
            raise ConfigError([str(e)]) from None
        self.protocol = make_protocol(cfg) if protocol is None else protocol
        try:
            self.protocol.check(self.pipeline)
        except ProtocolError as e:
            raise ConfigError([f"protocol: {e}"]) from None
        self._check_pipeline_size()

        self.attack = ATTACKS.get(cfg.attack.name, cfg.attack.params)
        try:  # an attack on a protocol's encoding (he_invalid_digits) runs only under that protocol
            check_attack_protocol(cfg.attack.name, getattr(self.protocol, "name", cfg.protocol))
        except ValueError as e:
            raise ConfigError([str(e)]) from None
        try:  # the data the Byzantine clients train on (label flip, backdoor), if the attack poisons it
            self.poison = make_poison(cfg.attack.name, cfg.attack.params, self.data.x_train, self.data.num_classes,
                                     y_train=self.data.y_train)  # edge_case_backdoor's pool of one class
        except ValueError as e:
            raise ConfigError([str(e)]) from None
        self.byzantine = byzantine_ids(seed, cfg.clients.num_clients, cfg.attack.f)
        if hasattr(self.poison, "bind"):  # a poison that differs per Byzantine client (DBA) learns who they are
            self.poison = self.poison.bind(self.byzantine)
        # sorted ids (not a mask over the population): a round looks its sample up in them
        self._byzantine_sorted = np.array(sorted(self.byzantine), dtype=np.int64)
        sv = cfg.server
        if sv.optimizer == "adam":
            self.server = ServerAdam(sv.lr, tuple(sv.betas), sv.eps, sv.weight_decay)
        else:
            self.server = ServerSGD(sv.lr, sv.momentum, sv.weight_decay)
        self.server = self.work.server_optimizer(self.server)  # zeroth-order FedSGD: client momentum
        # Noise that protects privacy, and the client sample DP amplifies by, come from a secret
        # unless the run opts into seeded randomness (fedsafe.core.randomness): never checkpointed.
        self.source = RandomSource.for_run(seed, cfg.secure_randomness)
        self.plugins = self._make_plugins(plugins)
        self._sampling_source = self.source if cfg.dp.enabled else None
        self.metrics = MetricsWriter(self.out_dir)
        self.rows: list[dict[str, Any]] = []

        params = flatten_params(self.model)
        # dsgd's client momentum: rows of the clients seen only (ClientRows), and none at all when
        # β = 0 (each round's clients then get zero rows, sized by the sample)
        self._keeps_rows = bool(self.work.keeps_momentum) and cfg.clients.momentum != 0
        momentum = ClientRows(params.numel(), params.dtype) if self._keeps_rows else None
        self.state = FederationState(round=0, params=params, momentum=momentum)
        dim = self.work.message_dim(params.numel())
        for p in implementing(self.plugins, "message_dim"):
            dim = p.message_dim(dim)
        self.message_dim = dim
        check_client_state(
            cfg, momentum_dim=params.numel() if self._keeps_rows else None,
            history_dim=dim if self.pipeline.uses_history else None,
        )
        bind = getattr(self.protocol, "bind_plugins", None)
        if bind is not None:  # secagg sizes its encoding ranges from what DP declares of the messages
            bind(self.plugins)
        self._preflight_protocol(dim)
        # what each round runs, resolved once (fedsafe.engine.round): shared with the Flower strategy
        self.plan = resolve_plan(
            self.protocol, self.pipeline, self.plugins, self.work.decode,
            clients_remote=bool(getattr(self.work, "remote_clients", False)),
            skip_on=(ProtocolError, RequirementError) if cfg.clients.sampling == "poisson" else (ProtocolError,),
        )
        self.ema = None
        if cfg.server.ema is not None:
            from fedsafe.engine.ema import EMA

            self.ema = EMA(cfg.server.ema, warmup=True, params=params)

    def _make_plugins(self, extra: Sequence[RoundPlugin]) -> list[RoundPlugin]:
        """Every registered round plugin this config enables (``ROUND_PLUGINS``, in registration
        order), then ``extra``; each is handed the client work before the first round."""
        made = make_plugins(
            self.cfg, self.source, flatten_params(self.model), tuple(len(ix) for ix in self.data.client_indices)
        )
        plugins = [*made, *extra]
        for p in implementing(plugins, "configure_clients"):
            p.configure_clients(self.work)
        return plugins

    @property
    def protocol(self) -> Any:
        """The protocol the rounds aggregate with (``make_protocol(cfg)``, or the one passed)."""
        return self._protocol

    @protocol.setter
    def protocol(self, protocol: Any) -> None:
        # a protocol swapped in after set-up (tests wire one in directly) is the one the rounds run
        self._protocol = protocol
        if getattr(self, "plan", None) is not None:
            self.plan = self.plan.with_protocol(protocol)

    @property
    def root(self) -> Any:
        """The server's root-dataset update of a rule that takes ``server_update`` (FLTrust), which
        the robust pipeline owns (:mod:`fedsafe.robust.root`); None for other rules."""
        return self.pipeline.root

    # --- set-up checks --------------------------------------------------------------------

    def _check_pipeline_size(self) -> None:
        check_pipeline_size(self.cfg, self.pipeline)

    def _preflight_protocol(self, dim: int) -> None:
        preflight_protocol(self.cfg, self.protocol, self.pipeline, dim)

    # --- resume ---------------------------------------------------------------------------

    def restore(self) -> None:
        """Continue from ``out_dir``'s checkpoint; metrics after it are dropped and redone.

        The checkpoint is checked against this run's config (round range, every tensor's shape,
        each plugin's state): a tampered or foreign checkpoint raises :class:`CheckpointError`.
        """
        if self.out_dir is None:
            raise ValueError("restore needs an out_dir")
        state = load_checkpoint(self.out_dir, run_identity(self.cfg))  # checksums, same run, metrics
        where = self.out_dir / CHECKPOINT
        d = self.state.params.numel()
        if not 0 <= state.round <= self.cfg.rounds:
            raise CheckpointError(f"{where}: round {state.round} is outside this run's 0..{self.cfg.rounds}")
        problem = self.server.buffer_problem(state.server_buf, d)
        if problem is not None:
            raise CheckpointError(f"{where}: server optimizer state: {problem}")
        if tuple(state.params.shape) != (d,):
            raise CheckpointError(f"{where}: params has shape {tuple(state.params.shape)}, this run's config needs {(d,)}")
        state.params = state.params.to(self.state.params.dtype)
        state.momentum = self._restored_momentum(state.momentum, where, d)
        if state.previous is not None and state.previous.dim() != 1:
            raise CheckpointError(f"{where}: previous aggregate must be a vector, got shape {tuple(state.previous.shape)}")
        if self.ema is not None and not isinstance(state.extra.get("_ema"), dict):
            raise CheckpointError(f"{where}: the moving average (server.ema) is missing")
        try:
            if self.ema is not None:
                self.ema.load_state_dict(state.extra["_ema"])
            self.pipeline.load_state_dict(
                state.extra, dim=self.message_dim, params=d, num_clients=self.cfg.clients.num_clients
            )
            for p in self.plugins:
                p.load_state_dict(state.extra.get(p.name, {}))
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as e:
            raise CheckpointError(f"{where}: plugin state does not fit this run: {e}") from None
        try:
            rows = self.metrics.truncate_after(state.round)
        except ValueError as e:
            raise CheckpointError(f"{self.out_dir}: metrics: {e}") from None
        self.state = state
        self.pipeline.previous = state.previous
        self.rows = rows

    # --- the round ------------------------------------------------------------------------

    def evaluate(self, params: Tensor | None = None) -> tuple[float, float]:
        """Mean test loss (cross-entropy, or the run's own loss) and accuracy of the global
        model (or its moving average, with ``server.ema``) on the test set."""
        if params is None:
            params = self.state.params if self.ema is None else self.ema.value
        weights = self.layout.unflatten(params)
        x, y = self.data.x_test, self.data.y_test
        loss, correct = 0.0, 0
        with torch.no_grad():
            for start in range(0, len(y), 4096):
                logits = functional_call(self.model, weights, (x[start : start + 4096],))
                yy = y[start : start + 4096]
                if self.loss_fn is None:
                    loss += float(F.cross_entropy(logits, yy, reduction="sum"))
                else:  # a batch mean
                    loss += float(self.loss_fn(logits, yy)) * len(yy)
                correct += int((logits.argmax(1) == yy).sum())
        return loss / len(y), correct / len(y)

    def attack_success_rate(self, params: Tensor | None = None) -> float | None:
        """For a backdoor attack: the fraction of triggered test inputs of the other classes that
        the evaluated model (or ``params``) assigns to the target (fedsafe.robust.backdoor);
        None for other attacks."""
        if self.poison is None:
            return None
        if params is None:
            params = self.state.params if self.ema is None else self.ema.value
        weights = self.layout.unflatten(params)
        return attack_success_rate(
            lambda x: functional_call(self.model, weights, (x,)), self.data.x_test, self.data.y_test, self.poison
        )

    def run_round(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        cfg, st = self.cfg, self.state
        t = st.round + 1
        ids = sample_clients(
            cfg.seed, t, cfg.clients.num_clients, cfg.clients.sampling,
            sample_size=cfg.clients.sample_size, sample_rate=cfg.clients.sample_rate, source=self._sampling_source,
        )
        is_byz = np.isin(ids, self._byzantine_sorted, assume_unique=True)
        honest, byz = ids[~is_byz], ids[is_byz]
        row: dict[str, Any] = {"round": t, "participants": len(ids), "byzantine": len(byz), "dropouts": 0}
        d = st.params.numel()

        skip = None
        if len(honest) == 0:
            skip = "no honest client sampled"
            # e.g. DP: an empty sample still releases noise
            if len(byz) == 0 and release_empty(self.plan, RoundContext(t, cfg.seed, (), 0), d, self._step):
                skip = None
        else:
            ctx = RoundContext(t, cfg.seed, tuple(map(int, honest)) + tuple(map(int, byz)), len(byz))
            try:
                self._aggregate_and_step(ctx, honest, byz, row)
            except ProtocolError as e:
                # A protocol that cannot finish (e.g. too many secure-aggregation dropouts).
                skip = str(e)
            except RequirementError as e:
                # A rule whose n/f requirement this round's sample broke: only Poisson sampling
                # varies the sample, and the configured size was checked at start-up.
                if cfg.clients.sampling != "poisson":
                    raise
                skip = str(e)
            except _Skip as e:
                skip = str(e)
        if skip is not None:
            row["skipped"] = skip
        # The model broadcast, plus whatever the protocol itself sent down to clients.
        row["bytes_down"] = float(len(ids) * d * st.params.element_size()) + row.get("bytes_down", 0.0)
        row.setdefault("bytes_up", 0.0)
        st.round = t
        if t % cfg.eval_every == 0 or t == cfg.rounds:
            row["test_loss"], row["test_accuracy"] = self.evaluate()
            if self.poison is not None and self.poison.trigger is not None:
                row["attack_success_rate"] = self.attack_success_rate()
        else:
            row["test_loss"] = row["test_accuracy"] = None
        end_round(self.plan, self, row)
        row["seconds"] = time.perf_counter() - t0
        self.rows.append(row)
        self.metrics.write(row)
        # After the row is written: a run killed in between resumes from an older checkpoint
        # and redoes the rounds after it, so metrics never miss a round.
        every = cfg.checkpoint_every
        if self.out_dir is not None and every and (t % every == 0 or t == cfg.rounds):
            st.extra = {p.name: p.state_dict() for p in self.plugins}
            if self.ema is not None:
                st.extra["_ema"] = self.ema.state_dict()
            st.extra.update(self.pipeline.state_dict())  # the rule's own state (FLTrust's root, FoolsGold's histories)
            save_checkpoint(st, self.out_dir, run_identity(cfg))
        return row

    def _aggregate_and_step(self, ctx: RoundContext, honest: np.ndarray, byz: np.ndarray, row: dict[str, Any]) -> None:
        """The honest clients' local work, then the round's stages (fedsafe.engine.round)."""
        st, t = self.state, ctx.round
        t_work = time.perf_counter()
        res = self.work.run(t, st.params, honest, self._momentum(honest))
        row["client_work_seconds"] = time.perf_counter() - t_work
        self._set_momentum(honest, res.momentum)
        updates, losses, reports = res.updates, res.losses, res.reports
        if res.survivors is not None:
            row["dropouts"] = int((~res.survivors).sum())
            keep = torch.from_numpy(res.survivors)
            honest, updates, losses = honest[res.survivors], updates[keep], losses[keep]
            if reports is not None:
                reports = [r for r, ok in zip(reports, res.survivors) if ok]
            if len(honest) == 0:
                raise _Skip("every honest client dropped out")
        row["train_loss"] = float(losses.mean())
        n = len(ctx.participants)
        skip = aggregate_and_step(
            self.plan, ctx, honest, updates, row, self._step, params=st.params, reports=reports,
            byzantine=(lambda u: Messages(byz, self._byzantine_updates(t, u, honest, byz, n))) if len(byz) else None,
        )
        if skip is not None:
            raise _Skip(skip)
        st.previous = self.pipeline.previous

    def _step(self, direction: Tensor) -> None:
        """The server optimizer's step, the round's model stage on its result
        (:func:`fedsafe.engine.round.finish_step`: CRFL's clip and noise), and the evaluated
        moving average after it. A step that
        leaves the model non-finite raises :class:`DivergedError` and keeps the state from before
        it (a non-finite *direction* was already a skipped round)."""
        st = self.state
        params, buf = self.server.step(st.params, direction, st.server_buf)
        if not bool(torch.isfinite(params).all()):
            c = self.cfg
            raise DivergedError(
                f"round {st.round + 1}: the model diverged: its parameters are not finite after the server "
                f"step on a finite direction (server.lr = {c.server.lr:g}, clients.lr = {c.clients.lr:g}); "
                "lower server.lr, or clients.lr with clients.algorithm = 'fedavg'"
            )
        # the model stage (fedsafe.engine.round.finish_step): CRFL's clip and noise
        st.params, st.server_buf = finish_step(self.plan, params, st.round + 1), buf
        if self.ema is not None:
            self.ema.update(st.params)

    def _restored_momentum(self, value: Any, where: Path, d: int) -> ClientRows | None:
        """A checkpoint's client momentum, checked against this run (its rows' width, client ids
        within the population); a run that keeps none accepts only an all-zero one (written before
        β = 0 stopped keeping rows)."""
        if value is None:
            if self._keeps_rows:
                raise CheckpointError(f"{where}: momentum is missing; this run keeps client momentum ({d} per client)")
            return None
        if not self._keeps_rows:
            rows = value.gather(value.ids()) if isinstance(value, ClientRows) else value
            if not self.work.keeps_momentum or bool(rows.any()):
                raise CheckpointError(f"{where}: it holds client momentum, this run's config keeps none")
            return None
        try:
            rows = value if isinstance(value, ClientRows) else ClientRows.from_state(value)
            return ClientRows.from_state(
                {"ids": torch.from_numpy(rows.ids()), "rows": rows.gather(rows.ids()).to(self.state.params.dtype)},
                dim=d, num_clients=self.cfg.clients.num_clients,
            )
        except ValueError as e:
            raise CheckpointError(f"{where}: momentum: {e}") from None

    def _momentum(self, ids: np.ndarray) -> Tensor | None:
        """The momentum rows of clients ``ids`` (zeros for a client not seen before; the stored
        rows themselves when every stored client takes part, in order); zero rows when β = 0."""
        if not self.work.keeps_momentum:
            return None
        m = self.state.momentum
        if m is None:  # β = 0: the rows are never read, and no state is kept
            return self.state.params.new_zeros((1, self.state.params.numel())).expand(len(ids), -1)
        return m.gather(ids)

    def _set_momentum(self, ids: np.ndarray, rows: Tensor | None) -> None:
        """Store new momentum rows (no copy when every stored client took part: nothing modifies
        a round's updates in place, by the convention of every hook)."""
        if rows is None or self.state.momentum is None:
            return
        self.state.momentum.scatter(ids, rows)

    def _byzantine_updates(
        self, t: int, honest: Tensor, honest_ids: np.ndarray, byz: np.ndarray, n: int
    ) -> Tensor:
        own = None
        ctx_ids = [*map(int, honest_ids), *map(int, byz)]  # the rows of what the attack aggregates
        if self.poison is not None:
            res = self.work.run(t, self.state.params, byz, self._momentum(byz), self.poison)
            self._set_momentum(byz, res.momentum)
            own = res.updates
        actx = AttackContext(
            f=len(byz),
            n=n,
            round=t,
            generator=torch_stream(self.cfg.seed, "attack", t),
            # rows are honest first, so a subset the attack aggregates (adaptive_fltrust: the honest
            # rows alone) is given the ids of its own rows, which rules that follow clients need
            aggregate=lambda u: self.pipeline.apply(u, t, ctx_ids[: len(u)]),
            state=self.state.attack_state,
            own_updates=own,
            honest_ids=tuple(map(int, honest_ids)),
            server_update=self.pipeline.server_update,  # FLTrust's root update (adaptive attacks that know it)
        )
        out = self.attack(honest, ctx=actx)
        if out.shape != (len(byz), honest.shape[1]):
            raise ValueError(
                f"attack {self.cfg.attack.name!r} returned shape {tuple(out.shape)}, "
                f"expected {(len(byz), honest.shape[1])}"
            )
        return out

    # --- the loop -------------------------------------------------------------------------

    def run(self, on_round: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Run the remaining rounds; returns the summary."""
        try:
            while self.state.round < self.cfg.rounds:
                row = self.run_round()
                if on_round is not None:
                    on_round(row)
        finally:
            self.close()
        warn_at_chance(self.cfg, self.rows, self.data.num_classes, self.message_dim)  # a run at chance level names the likely culprits
        return self.summary()

    def save_model(self, out_dir: Path) -> Path:
        """Write the evaluated model (the moving average with ``server.ema``) as ``model.pt``
        plus ``model.json``; rebuild it with :func:`fedsafe.models.load_trained`."""
        from fedsafe.models.saved import save_trained

        params = self.state.params if self.ema is None else self.ema.value
        self.layout.load_into(self.model, params)
        cfg = None if self.custom_model else self.cfg.model
        return save_trained(
            self.model, out_dir, cfg, self.data.input_shape, self.data.num_classes, privacy=privacy_stamp(self.private, self.source)
        )

    def close(self) -> None:
        """Release execution resources (a Ray instance, protocol worker processes)."""
        self.work.close()
        close = getattr(self.protocol, "close", None)
        if close is not None:
            close()

    @property
    def private(self) -> bool:
        """Whether a privacy mechanism (DP or inherent noise) runs in this experiment."""
        return uses_privacy_noise(self.cfg)

    def summary(self) -> dict[str, Any]:
        extra: dict[str, Any] = privacy_stamp(self.private, self.source)
        extra.update(plugin_summary(self.plan, self))
        return summarize(
            self.rows,
            name=self.cfg.name,
            pipeline=self.pipeline.describe(),
            attack=self.cfg.attack.name,
            f=self.cfg.attack.f,
            parameters=self.state.params.numel(),
            execution=getattr(self.work, "execution", None)
            or ("ray" if self.cfg.execution == "ray" else describe(self.backend)),
            **extra,
        )
