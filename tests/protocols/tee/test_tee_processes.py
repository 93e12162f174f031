"""The enclave and the accelerators as separate OS processes: one small session end to end."""

import multiprocessing as mp

import torch

from fedsafe.core.types import Message, RoundContext
from fedsafe.protocols.tee import TEEConfig, TEEProtocol
from fedsafe.protocols.tee.host import ProcessEndpoint
from fedsafe.robust.aggregators import AGGREGATORS
from fedsafe.robust.pipeline import RobustPipeline


def test_processes_round_trip_sealed_pool_and_clean_shutdown(tmp_path):
    g = torch.randn(7, 64, generator=torch.Generator().manual_seed(0))
    pipe = RobustPipeline("multi_krum", {}, [], 1, 0)
    msgs = [Message(i, g[i]) for i in range(7)]
    cfg = TEEConfig(clip=100.0, processes=True, device="cpu", precompute_rounds=2, sealed_dir=str(tmp_path),
                    timeout_s=120)
    with TEEProtocol(cfg) as proto:
        a1 = proto.aggregate(msgs, pipe, RoundContext(1, 0, tuple(range(7)), 1))
        assert len(list(tmp_path.iterdir())) == 1  # two sealed blocks written, one consumed
        a2 = proto.aggregate(msgs, pipe, RoundContext(2, 0, tuple(range(7)), 1))
        assert not list(tmp_path.iterdir())
        endpoints = list(proto.session.endpoints)
        assert all(isinstance(ep, ProcessEndpoint) and ep.process.is_alive() for ep in endpoints)
        assert len({ep.process.pid for ep in endpoints}) == 3
    want = AGGREGATORS.get("multi_krum")(g, f=1)
    assert torch.equal(a1.vector, want) and torch.equal(a2.vector, want)
    for a in (a1, a2):
        assert a.metrics["noise_online"] == 0
        assert a.seen["accelerator_1"]["matches_enclave"] and a.seen["accelerator_2"]["matches_enclave"]
        assert "Y" not in a.seen["accelerator_1"]  # nothing of theirs reaches the host
    assert a1.seen["accelerator_1"]["sha256"] != a2.seen["accelerator_1"]["sha256"]  # fresh noise
    assert all(ep.process.exitcode == 0 for ep in endpoints)  # asked to stop, and stopped
    assert not any(p.pid in {ep.process.pid for ep in endpoints} for p in mp.active_children())
