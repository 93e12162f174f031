"""``FedsafeStrategy``: swap fedsafe into your own Flower project in place of ``FedAvg``.

Your ClientApp stays as it is: it receives the global model's ``ArrayRecord`` (under
``"arrays"``) and a ``ConfigRecord`` (under ``"config"``) and replies with the model it trained.
The strategy then does what fedsafe's server does, on those models:

- sampling from a fixed population of ``clients.num_clients`` nodes (the first that connect,
  by node id) with fedsafe's schemes (``all``, ``fixed``, ``poisson``), so DP is accounted for
  the sampling that actually happens;
- each reply's update (its model minus the global model, floating-point arrays only: FedAvg's
  message, so ``clients.algorithm`` is ``fedavg``) goes through fedsafe's pre-aggregators and
  robust rule (``robust.*``, tolerating ``robust.f``
  Byzantine clients); a reply whose arrays do not match the global model's, or that is not
  finite, is left out and counted;
- DP (``[dp]``): ``central`` placement clips every update on the server and adds the noise to
  the sum there (you trust the server); ``local`` and ``distributed`` need the noise on the
  clients: add :func:`fedsafe.flower.dp_mod` to your ClientApp (``ClientApp(mods=[dp_mod])``);
  a reply that does not carry the mod's mark is refused, so no update reaches the aggregate
  unprotected. ε is accounted every round (dp-accounting) and written to the metrics rows;
- audit canaries (``[audit]``, with DP) are inserted into the aggregate and tracked, and the
  one-shot ε estimate is written at the end;
- the server step is ``global + server_lr · aggregate`` (``server_lr = 1``: FedAvg's), with
  optional server momentum; with ``[crfl]`` the new global model is then clipped to ρ_t and
  perturbed (``crfl.certify = false``: certifying needs the model and test data, which the
  strategy does not hold);
- every round appends a fedsafe metrics row to ``out_dir/metrics.jsonl`` (and ``rows``), and
  the last one writes ``summary.json``; ``aggregate_train`` also returns the row's numbers as
  its ``MetricRecord``, next to your clients' averaged train metrics.

Evaluation (``configure_evaluate`` / ``aggregate_evaluate``) is ``FedAvg``'s. Attacks are real
here (your clients): ``attack.*`` must stay unset; secure aggregation and zeroth-order clients
need fedsafe's own ClientApp (:func:`fedsafe.flower.server_app`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsafe.config import ConfigError, ExperimentConfig, apply_overrides, parse_override, validate
from fedsafe.flower.check import algorithm_problem, config_problems, pipeline_problem
from fedsafe.flower.records import FlowerError, check_like, flatten_arrays, unflatten_arrays

MARK = "fedsafe.dp"  # the dp_mod's mark in a reply's MetricRecord
CLIENT_SIDE = ("local", "distributed")


def _flwr_fedavg() -> type:
    from flwr.serverapp.strategy import FedAvg

    return FedAvg


class FedsafeStrategy(_flwr_fedavg()):  # type: ignore[misc]
    """fedsafe's server as a Flower ``Strategy`` (see the module docstring).

    ``config``: the fedsafe experiment (a TOML path, a dict or an ExperimentConfig) of which the
    strategy uses ``clients`` (population and sampling), ``robust``, ``dp``, ``audit``,
    ``rounds`` (replaced by ``start``'s ``num_rounds``) and ``seed``; ``overrides``:
    ``section.key=value`` items; ``out_dir``: where rows, the summary and the audit go (None:
    kept in ``rows`` only); ``wait``: seconds to wait for the population to connect.
    """

    def __init__(
        self,
        config: str | Path | Mapping[str, Any] | ExperimentConfig | None = None,
        *,
        overrides: Sequence[str] = (),
        out_dir: str | Path | None = None,
        server_lr: float = 1.0,
        server_momentum: float = 0.0,
        wait: float = 120.0,
        fraction_evaluate: float = 1.0,
        min_evaluate_nodes: int = 2,
        weighted_by_key: str = "num-examples",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
    ) -> None:
        from fedsafe.api import raw_config

        raw = apply_overrides(raw_config(config), dict(parse_override(o) for o in overrides))
        problem = algorithm_problem(raw)
        if problem is not None:
            raise ConfigError([problem])
        raw = apply_overrides(raw, {"clients.algorithm": "fedavg"})
        self.cfg = self._check(validate(raw))
        if not server_lr > 0:
            raise ConfigError([f"server_lr must be > 0, got {server_lr}"])
        if not 0 <= server_momentum < 1:
            raise ConfigError([f"server_momentum must be in [0, 1), got {server_momentum}"])
        if not wait > 0:
            raise ConfigError([f"wait must be > 0 seconds, got {wait}"])
        n = self.cfg.clients.num_clients
        super().__init__(
            fraction_train=1.0, fraction_evaluate=fraction_evaluate, min_train_nodes=1,
            min_evaluate_nodes=min_evaluate_nodes, min_available_nodes=n, weighted_by_key=weighted_by_key,
            arrayrecord_key=arrayrecord_key, configrecord_key=configrecord_key,
        )
        from fedsafe.engine.metrics import MetricsWriter
        from fedsafe.engine.server_optimizer import ServerSGD

        self.out_dir = None if out_dir is None else Path(out_dir)
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            (self.out_dir / "metrics.jsonl").unlink(missing_ok=True)
        self.metrics = MetricsWriter(self.out_dir)
        self.server = ServerSGD(server_lr, server_momentum)
        self.wait = wait
        self.rows: list[dict[str, Any]] = []
        self.errors: list[tuple[int, int, str]] = []  # (round, client, why its reply was left out)
        self.population: list[int] | None = None
        self.plugins: list[Any] | None = None
        self._pipeline: Any = None
        self.plan: Any = None  # the round (fedsafe.engine.round.RoundPlan), resolved at the first round
        self._round: dict[str, Any] = {}
        self._buf = None

    @staticmethod
    def _check(cfg: ExperimentConfig) -> ExperimentConfig:
        problems = config_problems(cfg)  # fedsafe.flower.check: what `fedsafe check --flower-strategy` says
        if problems:
            raise ConfigError(problems)
        return cfg

    # --- the loop -----------------------------------------------------------------------------

    def start(self, grid: Any, initial_arrays: Any, num_rounds: int = 3, *args: Any, **kwargs: Any) -> Any:
        """Flower's loop; ``num_rounds`` becomes the experiment's ``rounds`` (DP accounting)."""
        if num_rounds != self.cfg.rounds:
            self.cfg = self._check(validate({**self.cfg.to_dict(), "rounds": num_rounds}))
        return super().start(grid, initial_arrays, num_rounds, *args, **kwargs)

    def summary(self) -> None:
        from flwr.common.logger import log

        p = self.cfg.robust
        log(20, "\t├──> fedsafe: rule %s (f = %s), pre %s, dp %s, audit %s", p.rule, self.cfg.rule_f,
            [s.name for s in p.pre], self.cfg.dp.placement if self.cfg.dp.enabled else "off",
            "on" if self.cfg.audit.enabled else "off")
        super().summary()

    def _set_up(self, grid: Any, flat: torch.Tensor) -> None:
        """On the first round: the population (the first ``num_clients`` nodes by id) and the
        server's pipeline and round plugins."""
        from fedsafe.core.plugins import make_plugins
        from fedsafe.core.protocol import PlainProtocol, ProtocolError
        from fedsafe.core.randomness import RandomSource
        from fedsafe.engine.round import resolve_plan
        from fedsafe.robust.pipeline import RobustPipeline

        cfg, n = self.cfg, self.cfg.clients.num_clients
        deadline = time.monotonic() + self.wait
        while len(ids := sorted(grid.get_node_ids())) < n:
            if time.monotonic() > deadline:
                raise FlowerError(f"after {self.wait:g} s only {len(ids)} of clients.num_clients = {n} nodes are connected")
            time.sleep(0.5)
        self.population = ids[:n]
        try:
            self._pipeline = RobustPipeline(cfg.robust.rule, cfg.robust.params, [(p.name, p.params) for p in cfg.robust.pre],
                                            cfg.rule_f, cfg.seed)
        except ValueError as e:
            raise ConfigError([f"robust: {e}"]) from None
        problem = pipeline_problem(self._pipeline, cfg.robust.rule)
        if problem is not None:
            raise ConfigError([problem])
        # DP noise and, under DP, the client sample: from a secret unless the config is seeded
        self.source = RandomSource.for_run(cfg.seed, cfg.secure_randomness)
        self.plugins = make_plugins(cfg, self.source, flat, (1,) * n)
        d = flat.numel()
        # the engine's round (fedsafe.engine.round), resolved once: the server sees every reply
        # (plain protocol); under local or distributed DP the clients' dp_mod ran the client side
        self.plan = resolve_plan(
            PlainProtocol(), self._pipeline, self.plugins, lambda vector, t: -vector[:d],
            clients_remote=cfg.dp.enabled and cfg.dp.placement in CLIENT_SIDE, record_cost=False,
            skip_on=(ProtocolError, ValueError),
        )

    def configure_train(self, server_round: int, arrays: Any, config: Any, grid: Any) -> Iterable[Any]:
        from flwr.app import ConfigRecord, Message, MessageType, RecordDict

        from fedsafe.core.plugins import implementing
        from fedsafe.engine.sampling import sample_clients

        flat, layout = flatten_arrays(arrays)
        if self.population is None:
            self._set_up(grid, flat)
        c = self.cfg.clients
        ids = sample_clients(self.cfg.seed, server_round, c.num_clients, c.sampling,
                             sample_size=c.sample_size, sample_rate=c.sample_rate,
                             source=self.source if self.cfg.dp.enabled else None)
        state: dict[str, Any] = {"fedsafe.round": int(server_round)}
        if self.cfg.dp.enabled and self.cfg.dp.placement in CLIENT_SIDE:
            state["fedsafe.config"] = self.cfg.to_toml()  # what dp_mod needs to add its noise
            for p in implementing(self.plugins, "client_state"):
                state.update({f"fedsafe.{p.name}.{k}": float(v) for k, v in p.client_state().items()})
        msgs = {}
        for cid in map(int, ids):
            conf = ConfigRecord({**dict(config), **state, "fedsafe.client": cid})
            content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: conf})
            msgs[cid] = Message(content, dst_node_id=self.population[cid], message_type=MessageType.TRAIN,
                                group_id=str(server_round))
        self._round = {"round": server_round, "flat": flat, "layout": layout, "template": arrays, "ids": ids,
                       "messages": msgs, "t0": time.perf_counter()}
        return list(msgs.values())

    def aggregate_train(self, server_round: int, replies: Iterable[Any]) -> tuple[Any, Any]:
        from flwr.app import MetricRecord

        from fedsafe.config import uses_privacy_noise
        from fedsafe.core.plugins import HostView, ModelState
        from fedsafe.core.randomness import privacy_stamp
        from fedsafe.core.types import RoundContext
        from fedsafe.engine.metrics import summarize, write_summary
        from fedsafe.engine.round import aggregate_and_step, end_round, finish_step, plugin_summary

        rd = self._round
        if rd.get("round") != server_round:
            raise FlowerError(f"aggregate_train for round {server_round}, but round {rd.get('round')} was configured")
        flat, layout, ids = rd["flat"], rd["layout"], rd["ids"]
        cfg, dp = self.cfg, self.cfg.dp
        client_side = dp.enabled and dp.placement in CLIENT_SIDE
        adaptive = dp.enabled and dp.adaptive  # central: transform_honest appends the bit here
        key_of = {m.metadata.message_id: cid for cid, m in rd["messages"].items()}
        row: dict[str, Any] = {"round": server_round, "participants": len(ids), "byzantine": 0}
        counts = {"dropouts": 0, "excluded_malformed": 0, "excluded_unprotected": 0}
        got: dict[int, tuple[torch.Tensor, dict[str, float]]] = {}
        good = []
        for reply in replies:
            cid = key_of.get(reply.metadata.reply_to_message_id)
            if cid is None or reply.has_error() or cid in got:
                continue
            what = f"client {cid}'s reply"
            try:
                local = reply.content[self.arrayrecord_key]
                check_like(local, layout, what=what)
                metrics = reply.content.metric_records.get("metrics", {})
                report = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
                delta = flatten_arrays(local)[0].to(flat.dtype) - flat
                if client_side:
                    clip = rd["messages"][cid].content[self.configrecord_key].get("fedsafe.dp.clip")
                    if report.get(MARK) != 1.0 or report.get("fedsafe.clip") != clip:
                        counts["excluded_unprotected"] += 1  # no dp_mod noise on it: refused
                        continue
                if client_side and adaptive:  # the clipping bit dp_mod computed (with its noise share)
                    if "fedsafe.dp_bit" not in report:
                        counts["excluded_unprotected"] += 1
                        continue
                    delta = torch.cat([delta, delta.new_tensor([report["fedsafe.dp_bit"]])])
            except (FlowerError, KeyError) as e:
                counts["excluded_malformed"] += 1
                self.errors.append((server_round, cid, str(e)))
                continue
            got[cid] = (delta, report)
            good.append(reply)
        counts["dropouts"] = len(ids) - len(got) - counts["excluded_malformed"] - counts["excluded_unprotected"]
        row.update(counts)
        honest = np.array(sorted(got), dtype=np.int64)
        ctx = RoundContext(server_round, cfg.seed, tuple(map(int, honest)), 0)
        d = flat.numel()
        new = flat

        def step(direction: torch.Tensor) -> None:
            nonlocal new
            new, self._buf = self.server.step(flat, direction, self._buf)
            new = finish_step(self.plan, new, server_round)  # the model stage: CRFL's clip and noise

        if len(honest) == 0:
            skip: str | None = "no usable reply"
        else:
            updates = torch.stack([got[int(c)][0] for c in honest])
            reports = None
            if client_side:  # what each client's dp_mod reported (else the trusted server clips: central DP)
                reports = [{k[8:]: v for k, v in got[int(c)][1].items() if k.startswith("fedsafe.")} for c in honest]
            skip = aggregate_and_step(self.plan, ctx, honest, updates, row, step, reports=reports)
        if skip is not None:
            row["skipped"] = skip
        losses = [r.get("train_loss", r.get("loss")) for _, r in got.values()]
        losses = [x for x in losses if x is not None]
        if losses:
            row["train_loss"] = float(np.mean(losses))
        host = HostView(cfg, ModelState(server_round, new), self.out_dir, self.rows)
        end_round(self.plan, host, row)
        row["seconds"] = time.perf_counter() - rd["t0"]
        self.rows.append(row)
        self.metrics.write(row)
        if server_round == cfg.rounds and self.out_dir is not None:
            extra: dict[str, Any] = privacy_stamp(uses_privacy_noise(cfg), self.source)
            extra.update(plugin_summary(self.plan, host))
            write_summary(self.out_dir, summarize(self.rows, name=cfg.name, pipeline=self._pipeline.describe(),
                                                  attack="real clients", f=cfg.rule_f, parameters=d,
                                                  execution="flower strategy", **extra))
        try:  # your clients' train metrics, averaged as FedAvg does (weighted by num-examples)
            metrics = self.train_metrics_aggr_fn([r.content for r in good], self.weighted_by_key) if good else MetricRecord()
        except (KeyError, ValueError, TypeError):
            metrics = MetricRecord()
        for k, v in row.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) and k != "round":
                metrics[f"fedsafe.{k}"] = float(v)
        return unflatten_arrays(new, rd["template"]), metrics


