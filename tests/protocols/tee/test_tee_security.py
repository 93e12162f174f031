"""Attestation, channels, sealed noise, freshness, leakage accounting and the documented threats."""

import math
import sys

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

import fedsafe.protocols.tee.accelerator as accelerator_module
from fedsafe.core.protocol import ProtocolError
from fedsafe.core.types import Message, RoundContext
from fedsafe.protocols.tee import (
    AttestationError,
    IntegrityError,
    SimulatedPlatform,
    TEEConfig,
    TEEProtocol,
    measure,
    mi_bound_bits,
    noise_constant,
    noise_ratio_for_bits,
    noise_variance,
    verify_quote,
)
from fedsafe.protocols.tee.channel import (
    ChannelEnd,
    client_binding,
    open_sealed,
    public_bytes,
    seal_for,
)
from fedsafe.protocols.tee.client import TEEClient
from fedsafe.protocols.tee.enclave import DecodeError
from fedsafe.protocols.tee.host import TEESession
from fedsafe.protocols.tee.noise import (
    NoiseError,
    NoisePool,
    make_block,
    orthogonal_noise,
    seal_block,
    secure_standard_normal,
    unseal_block,
)
from fedsafe.protocols.tee.threats import (
    client_accelerator_projection,
    collude,
    norm_projection,
)
from fedsafe.protocols.tee.wire import pack, unpack
from fedsafe.robust.pipeline import RobustPipeline


def upload(s: TEESession, client: TEEClient, vector: torch.Tensor, round_: int) -> bytes:
    """The client's upload after a fresh challenge: the enclave quotes over the client's nonce."""
    return client.encrypt(vector, round_, quote=s.attest([client.challenge()])[0])


def flip(data: bytes, at: int) -> bytes:
    b = bytearray(data)
    b[at] ^= 0x01
    return bytes(b)


# --- attestation -----------------------------------------------------------------------------


def test_quote_verifies_and_each_wrong_part_is_refused():
    platform = SimulatedPlatform()
    m, key, nonce = measure(), b"k" * 32, b"n" * 16
    quote = platform.quote(measurement=m, enclave_public=key, nonce=nonce).to_bytes()
    assert verify_quote(quote, verification_key=platform.verification_key, expected_measurement=m, nonce=nonce) == key
    with pytest.raises(AttestationError, match="measurement"):  # the enclave runs other code
        other = platform.quote(measurement=b"\x00" * 32, enclave_public=key, nonce=nonce).to_bytes()
        verify_quote(other, verification_key=platform.verification_key, expected_measurement=m, nonce=nonce)
    with pytest.raises(AttestationError, match="signature"):  # signed by another platform
        verify_quote(quote, verification_key=SimulatedPlatform().verification_key, expected_measurement=m, nonce=nonce)
    at = quote.index(key)
    with pytest.raises(AttestationError, match="signature"):  # the bound key swapped in transit
        verify_quote(flip(quote, at), verification_key=platform.verification_key, expected_measurement=m, nonce=nonce)
    with pytest.raises(AttestationError, match="nonce"):  # a replayed quote
        verify_quote(quote, verification_key=platform.verification_key, expected_measurement=m, nonce=b"x" * 16)


def test_measurement_is_a_hash_of_the_enclave_code(tmp_path, monkeypatch):
    mod = tmp_path / "tee_measured_module.py"
    mod.write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = measure(("tee_measured_module",))
    mod.write_text("X = 2\n")
    assert measure(("tee_measured_module",)) != before
    assert len(measure()) == 32 and measure() == measure()


def test_client_sends_nothing_to_an_enclave_with_unexpected_code():
    with TEESession({"clip": 1.0}, processes=False) as s:
        good = TEEClient(7, verification_key=s.verification_key)
        assert upload(s, good, torch.ones(3), 1)
        bad = TEEClient(7, verification_key=s.verification_key, measurement=b"\x01" * 32)
        with pytest.raises(AttestationError, match="measurement"):
            upload(s, bad, torch.ones(3), 1)


# --- channels --------------------------------------------------------------------------------


def test_client_ciphertext_is_bound_to_round_client_and_bytes():
    key = X25519PrivateKey.generate()
    ctx, aad = client_binding(b"m" * 32, 3, 5, 4)
    sealed = seal_for(public_bytes(key), b"0123456789abcdef", context=ctx, aad=aad)
    assert open_sealed(key, sealed, context=ctx, aad=aad) == b"0123456789abcdef"
    with pytest.raises(IntegrityError):
        open_sealed(key, flip(sealed, 40), context=ctx, aad=aad)
    for other in (client_binding(b"m" * 32, 4, 5, 4), client_binding(b"m" * 32, 3, 6, 4)):
        with pytest.raises(IntegrityError):  # replayed into another round / relabelled
            open_sealed(key, sealed, context=other[0], aad=other[1])


def test_enclave_rejects_tampered_and_relabelled_uploads_and_aggregates_the_rest():
    g = torch.randn(8, 50)
    pipe = RobustPipeline("multi_krum", {}, [], 1, 0)
    with TEESession({"clip": 100.0}, processes=False) as s:
        ups = {f"c{k}": upload(s, TEEClient(k, verification_key=s.verification_key), g[k], 1) for k in range(8)}
        ups["c2"] = flip(ups["c2"], len(ups["c2"]) - 5)  # tampered ciphertext
        ups["c4"] = ups["c5"]  # client 5's upload presented as client 4's
        head, _, _ = s.call(s.enclave, {"op": "encode", "round": 1, "dim": 50, "clients": list(range(8))}, blobs=ups)
        assert head["rejected"] == 2 and head["n"] == 6


def test_channel_rejects_tampering_replay_and_wrong_kind():
    e, a = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    enc = ChannelEnd(e, public_bytes(a), name="accelerator-1", role="enclave")
    acc = ChannelEnd(a, public_bytes(e), name="accelerator-1", role="accelerator")
    m0, m1 = enc.seal(b"first", kind="encoded"), enc.seal(b"second", kind="encoded")
    with pytest.raises(IntegrityError, match="expected message 0"):
        acc.open(m1, kind="encoded")  # reordered
    with pytest.raises(IntegrityError, match="authentication"):
        acc.open(flip(m0, len(m0) - 1), kind="encoded")
    assert acc.open(m0, kind="encoded") == b"first"
    with pytest.raises(IntegrityError):
        acc.open(m0, kind="encoded")  # replayed
    with pytest.raises(IntegrityError, match="expected a 'encoded'"):
        acc.open(enc.seal(b"x", kind="gram"), kind="encoded")
    back = acc.seal(b"reply", kind="gram")
    with pytest.raises(IntegrityError):  # a reply is not valid in the other direction
        ChannelEnd(a, public_bytes(e), name="accelerator-1", role="accelerator").open(back, kind="gram")


def round_parts(s, g, round_):
    ups = {f"c{k}": upload(s, TEEClient(k, verification_key=s.verification_key), g[k], round_)
           for k in range(g.shape[0])}
    _, _, to = s.call(s.enclave, {"op": "encode", "round": round_, "dim": g.shape[1],
                                  "clients": list(range(g.shape[0]))}, blobs=ups)
    return [s.call(acc, {"op": "gram"}, blobs={"data": to[f"to_{i}"]})[2]["result"]
            for i, acc in enumerate(s.accelerators, 1)]


def test_tampered_or_lying_accelerator_results_are_caught(monkeypatch):
    g = torch.randn(6, 40)
    decode = {"op": "decode", "round": 1, "rule": "multi_krum", "f": 1}
    with TEESession({"clip": 100.0}, processes=False) as s:
        r1, r2 = round_parts(s, g, 1)
        with pytest.raises(IntegrityError):
            s.call(s.enclave, decode, blobs={"from_1": flip(bytes(r1), len(r1) - 3), "from_2": r2})
    # a correctly encrypted but wrong Gram matrix fails the enclave's norm check
    real = accelerator_module.split_gram
    monkeypatch.setattr(accelerator_module, "split_gram", lambda y: tuple(t * 1.001 for t in real(y)))
    with TEESession({"clip": 100.0}, processes=False) as s:
        r1, r2 = round_parts(s, g, 1)
        with pytest.raises(DecodeError, match="inconsistent"):
            s.call(s.enclave, decode, blobs={"from_1": r1, "from_2": r2})


def test_protocol_skips_a_round_with_a_faulty_accelerator_and_restarts(monkeypatch):
    g = torch.randn(6, 40)
    pipe = RobustPipeline("multi_krum", {}, [], 1, 0)
    msgs = [Message(i, g[i]) for i in range(6)]
    real = accelerator_module.split_gram
    with TEEProtocol(TEEConfig(clip=100.0, processes=False)) as proto:
        monkeypatch.setattr(accelerator_module, "split_gram", lambda y: tuple(t * 1.001 for t in real(y)))
        with pytest.raises(ProtocolError, match="inconsistent.*restarts"):
            proto.aggregate(msgs, pipe, RoundContext(1, 0, tuple(range(6)), 1))
        assert proto.session is None
        monkeypatch.setattr(accelerator_module, "split_gram", real)
        proto.aggregate(msgs, pipe, RoundContext(2, 0, tuple(range(6)), 1))  # a fresh, attested session


# --- noise: construction, sealing, freshness -------------------------------------------------


def test_noise_is_equidistant_orthogonal_and_refuses_n_above_d():
    c = 8.0
    r = orthogonal_noise(7, 300, c)
    d2 = ((r[:, None] - r[None]) ** 2).sum(-1)
    off = ~torch.eye(7, dtype=torch.bool)
    torch.testing.assert_close(d2[off], torch.full((42,), c, dtype=torch.float64), rtol=1e-12, atol=0)
    torch.testing.assert_close(r @ r.T, (c / 2) * torch.eye(7, dtype=torch.float64), rtol=0, atol=1e-12 * c)
    with pytest.raises(NoiseError, match="at most d"):
        orthogonal_noise(5, 4, c)
    z = secure_standard_normal(200_000)
    assert abs(z.mean()) < 0.01 and abs(z.var() - 1) < 0.02
    assert not np.array_equal(z[:100], secure_standard_normal(100))


def test_sealed_block_round_trip_and_tamper_detection():
    key, other = b"k" * 32, b"j" * 32
    block = make_block(3, 5, 64, 2.0, 1.0, "exact")
    sealed = seal_block(block, key, "pool")
    assert block.r.numpy().tobytes()[:64] not in sealed  # the noise is not stored in the clear
    back = unseal_block(sealed, key, "pool", 3)
    assert torch.equal(back.r, block.r) and torch.equal(back.k_hi, block.k_hi) and torch.equal(back.k_lo, block.k_lo)
    assert (back.q, back.c, back.clip, back.arithmetic) == (block.q, block.c, block.clip, block.arithmetic)
    for bad in (lambda: unseal_block(flip(sealed, len(sealed) - 20), key, "pool", 3),  # tampered ciphertext
                lambda: unseal_block(sealed.replace(b'"c":2.0', b'"c":3.0'), key, "pool", 3),  # header edited
                lambda: unseal_block(sealed, other, "pool", 3),  # another enclave's key
                lambda: unseal_block(sealed, key, "pool", 4),  # replayed as another round
                lambda: unseal_block(sealed, key, "other", 3)):  # from another pool
        with pytest.raises(IntegrityError):
            bad()


def test_pool_hands_out_each_block_once_and_detects_swapped_files(tmp_path):
    pool = NoisePool(b"k" * 32, tmp_path)
    pool.precompute(3, 4, 32, 2.0, 1.0, "exact")
    files = sorted(tmp_path.iterdir())
    assert len(files) == 3
    b0 = pool.take(4, 32, 2.0, 1.0, "exact")
    assert not files[0].exists()  # read once, then deleted
    files[2].replace(files[1])  # the host swaps round 2's file into round 1's place
    with pytest.raises(IntegrityError, match="replayed or swapped"):
        pool.take(4, 32, 2.0, 1.0, "exact")
    with pytest.raises(IntegrityError, match="missing"):  # ... and round 2's block is gone
        pool.take(4, 32, 2.0, 1.0, "exact")
    b_online = pool.take(4, 32, 2.0, 1.0, "exact")  # pool exhausted: drawn on the spot
    assert b_online.seq < 0 and pool.generated_online == 1
    cos = float((b0.r[0] @ b_online.r[0]) / (b0.r[0].norm() * b_online.r[0].norm()))
    assert abs(cos) < 0.9  # fresh noise, not a reused block


def test_noise_is_fresh_every_round_and_rounds_cannot_be_replayed():
    g = torch.randn(6, 200)
    pipe = RobustPipeline("multi_krum", {}, [], 1, 0)
    msgs = [Message(i, g[i]) for i in range(6)]
    with TEEProtocol(TEEConfig(clip=100.0, processes=False)) as proto:
        y_a = proto.aggregate(msgs, pipe, RoundContext(1, 0, tuple(range(6)), 1)).seen["accelerator_1"]["Y"].clone()
        y_b = proto.aggregate(msgs, pipe, RoundContext(2, 0, tuple(range(6)), 1)).seen["accelerator_1"]["Y"]
        r_a, r_b = y_a - g.double(), y_b - g.double()  # same updates, so Y differs only by R
        cos = (r_a * r_b).sum(1) / (r_a.norm(dim=1) * r_b.norm(dim=1))
        assert float(cos.abs().max()) < 0.5  # independent directions in d = 200 (|cos| ~ 0.07)
        with pytest.raises(ProtocolError, match="noise is per round"):
            proto.aggregate(msgs, pipe, RoundContext(2, 0, tuple(range(6)), 1))


# --- leakage ---------------------------------------------------------------------------------


def test_mi_bound_from_clip_and_sigma():
    d, clip, rho = 1000, 3.0, 250.0
    var = clip**2 / d  # the largest equal per-coordinate variance ‖g‖ ≤ clip allows
    sigma2 = noise_variance(clip, d, rho)
    assert sigma2 == pytest.approx(rho * var) and noise_constant(clip, rho) == pytest.approx(2 * d * sigma2)
    assert mi_bound_bits(d, rho) == pytest.approx(math.fsum(0.5 * math.log2(1 + var / sigma2) for _ in range(d)))
    for bits in (1e-3, 0.5, 40.0):
        assert mi_bound_bits(d, noise_ratio_for_bits(d, bits)) == pytest.approx(bits, rel=1e-10)


# --- threats ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def encoded_round():
    n, d, rho, clip = 7, 300, 1e6, 40.0
    g = torch.randn(n, d, generator=torch.Generator().manual_seed(9))
    with TEEProtocol(TEEConfig(noise_ratio=rho, clip=clip, processes=False)) as proto:
        agg = proto.aggregate([Message(i, g[i]) for i in range(n)], RobustPipeline("krum", {}, [], 1, 0),
                              RoundContext(1, 0, tuple(range(n)), 1))
    return g, agg.seen["accelerator_1"]["Y"], agg.seen["accelerator_2"]["Y"], noise_constant(clip, rho)


def test_threat_colluding_accelerators_recover_every_update(encoded_round):
    g, y1, y2, c = encoded_round
    recovered = collude(y1, y2)
    q = 2.0 ** (math.frexp(40.0 * 1.0001 + float((y1 - y2).abs().max()) / 2)[1] - 53)
    assert float((recovered - g.double()).abs().max()) <= q / 2  # g up to the enclave's grid
    assert torch.equal(recovered.float(), g)  # exactly the float32 updates


def test_threat_client_with_accelerator_learns_projections_of_others(encoded_round):
    g, y1, _, _ = encoded_round
    b = 6  # the colluding (Byzantine) client
    r_b, p = client_accelerator_projection(y1, b, g[b])
    truth = g.double() @ r_b
    others = torch.arange(7) != b
    rel = (p - truth)[others].abs() / truth[others].abs()
    assert float(rel.max()) < 1e-6  # ⟨g_i, R_b⟩ for every other client, to float64 rounding


def test_threat_fixed_norm_noise_reveals_one_projection(encoded_round):
    g, y1, _, c = encoded_round
    est = norm_projection(y1, c)
    truth = (g.double() * y1).sum(1) / torch.linalg.vector_norm(y1, dim=1)
    slack = torch.linalg.vector_norm(g.double(), dim=1) ** 2 / (2 * torch.linalg.vector_norm(y1, dim=1))
    assert bool(((est - truth).abs() <= slack * 1.001 + 1e-9).all())
    assert float((est - truth).abs().max()) < 0.1 * float(truth.abs().max())


# --- wire format -----------------------------------------------------------------------------


def test_frames_round_trip_and_malformed_frames_are_errors():
    from fedsafe.protocols.tee.wire import WireError

    a = np.arange(6, dtype=np.float64).reshape(2, 3)
    head, arrays, blobs = unpack(pack({"x": 1}, {"a": a}, {"b": b"xyz"}))
    assert head == {"x": 1} and np.array_equal(arrays["a"], a) and bytes(blobs["b"]) == b"xyz"
    frame = pack({"x": 1}, {"a": a})
    for bad in (frame[:-1],  # truncated payload
                frame.replace(b'"<f8"', b'"|O8"'),  # an object dtype is never accepted
                b"NOPE" + frame[4:],  # not a frame
                frame.replace(b"[2,3]", b"[9,3]")):  # shape larger than the payload
        with pytest.raises(WireError):
            unpack(bad)


def test_the_measurement_covers_every_module_the_enclave_loads():
    # A module the enclave imports but the measurement skips could change without the quote
    # changing: every fedsafe module loaded with the enclave must be measured.
    import subprocess
    import sys

    code = (
        "import sys, fedsafe.protocols.tee.enclave; from fedsafe.protocols.tee.attestation import ENCLAVE_MODULES; "
        "print(sorted(m for m in sys.modules if m.startswith('fedsafe') and m not in ENCLAVE_MODULES))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]", res.stdout
