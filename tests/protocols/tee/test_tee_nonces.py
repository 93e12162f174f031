"""Nonces: the sealing nonces of precomputed noise, and the attestation nonce that makes a quote
fresh. Both must be unique where reuse breaks the guarantee (an AES-GCM (key, nonce) pair; a
quote accepted by a client that did not just ask for it)."""

import struct

import pytest
import torch
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

import fedsafe.protocols.tee.client as client_module
import fedsafe.protocols.tee.noise as noise_module
from fedsafe.core.protocol import ProtocolError
from fedsafe.core.types import Message, RoundContext
from fedsafe.protocols.tee import AttestationError, TEEConfig, TEEProtocol
from fedsafe.protocols.tee.client import TEEClient
from fedsafe.protocols.tee.host import TEESession
from fedsafe.protocols.tee.noise import NoisePool, make_block, seal_block, unseal_block
from fedsafe.protocols.tee.wire import unpack
from fedsafe.robust.pipeline import RobustPipeline

# --- sealing: the format the noise module's docstring states ---------------------------------


def _documented_open(sealed: bytes, key: bytes) -> tuple[bytes, bytes, list[tuple[bytes, bytes]]]:
    """Decrypt a sealed file by the documented construction alone: per-file key
    ``HKDF-SHA256(key, salt, info="fedsafe/tee/sealed-noise/v2")``, chunk ``i`` under the 96-bit
    nonce ``0x00000000 ‖ uint64_be(i)`` with associated data ``aad ‖ uint32_le(i) ‖
    uint32_le(count)``. Returns (salt, plaintext, [(file key, nonce) per chunk])."""
    head, _, blobs = unpack(sealed)
    assert head == {"sealed_noise": 2, "chunks": head["chunks"]}
    count, salt, aad = head["chunks"], bytes(blobs["salt"]), bytes(blobs["aad"])
    assert len(salt) == 32 and set(blobs) == {"aad", "salt", *(f"c{i}" for i in range(count))}
    file_key = HKDF(algorithm=hashes.SHA256(), length=32, salt=salt,
                    info=b"fedsafe/tee/sealed-noise/v2").derive(key)
    plain, used = b"", []
    for i in range(count):
        nonce = bytes(4) + struct.pack(">Q", i)
        plain += AESGCM(file_key).decrypt(nonce, bytes(blobs[f"c{i}"]), aad + struct.pack("<II", i, count))
        used.append((file_key, nonce))
    return salt, plain, used


def test_sealed_chunks_never_share_a_key_and_nonce(monkeypatch):
    # chunks of 64 bytes: one block becomes a large file of many GCM messages
    monkeypatch.setattr(noise_module, "_SEAL_CHUNK", 64)
    key = b"k" * 32
    seen: set[tuple[bytes, bytes]] = set()
    salts = set()
    for seq in range(40):
        block = make_block(seq, 4, 48, 2.0, 1.0, "exact")
        sealed = seal_block(block, key, "pool")
        salt, plain, used = _documented_open(sealed, key)
        assert len(used) >= 30  # many chunks in one file
        _, arrays, _ = unpack(plain)
        assert torch.equal(torch.from_numpy(arrays["r"].copy()), block.r)
        assert seen.isdisjoint(used) and len(set(used)) == len(used)
        seen.update(used)
        salts.add(salt)
        back = unseal_block(sealed, key, "pool", seq)
        assert torch.equal(back.r, block.r) and torch.equal(back.k_hi, block.k_hi)
    assert len(salts) == 40


def test_sealed_chunks_are_bound_to_their_position(monkeypatch):
    monkeypatch.setattr(noise_module, "_SEAL_CHUNK", 64)
    key = b"k" * 32
    sealed = seal_block(make_block(0, 3, 32, 2.0, 1.0, "exact"), key, "pool")
    head, _, blobs = unpack(sealed)
    file_key = HKDF(algorithm=hashes.SHA256(), length=32, salt=bytes(blobs["salt"]),
                    info=b"fedsafe/tee/sealed-noise/v2").derive(key)
    aad1 = bytes(blobs["aad"]) + struct.pack("<II", 1, head["chunks"])
    with pytest.raises(InvalidTag):  # chunk 1 does not open under chunk 0's nonce
        AESGCM(file_key).decrypt(bytes(12), bytes(blobs["c1"]), aad1)
    with pytest.raises(InvalidTag):  # nor under the sealing key itself: each file has its own
        AESGCM(key).decrypt(bytes(4) + struct.pack(">Q", 1), bytes(blobs["c1"]), aad1)


def test_sealed_pool_files_use_fresh_salts(tmp_path):
    pool = NoisePool(b"s" * 32, tmp_path)
    pool.precompute(5, 3, 16, 2.0, 1.0, "float64")
    salts = {bytes(unpack(p.read_bytes())[2]["salt"]) for p in tmp_path.iterdir()}
    assert len(salts) == 5
    for _ in range(5):
        assert pool.take(3, 16, 2.0, 1.0, "float64").seq >= 0


# --- attestation: the client's own nonce ------------------------------------------------------


def _round(proto, g, round_):
    pipe = RobustPipeline("multi_krum", {}, [], 1, 0)
    msgs = [Message(10 + i, g[i]) for i in range(g.shape[0])]
    return proto.aggregate(msgs, pipe, RoundContext(round_, 0, tuple(m.client_id for m in msgs), 1))


def test_every_client_verifies_a_quote_over_its_own_fresh_nonce(monkeypatch):
    verified = []
    real = client_module.verify_quote

    def recording(quote, **kw):
        verified.append(kw["nonce"])
        return real(quote, **kw)

    monkeypatch.setattr(client_module, "verify_quote", recording)
    g = torch.randn(6, 30)
    with TEEProtocol(TEEConfig(clip=100.0, processes=False)) as proto:
        _round(proto, g, 1)
        _round(proto, g, 2)
    assert len(verified) == 12
    assert len(set(verified)) == 12 and all(len(n) >= 16 for n in verified)  # per client, per round


def test_host_replaying_an_old_quote_is_refused(monkeypatch):
    g = torch.randn(6, 30)
    with TEEProtocol(TEEConfig(clip=100.0, processes=False)) as proto:
        _round(proto, g, 1)
        session = proto.session
        stale = session.attest([TEEClient(0, verification_key=session.verification_key).challenge()
                                for _ in range(6)])  # quotes over nonces no client of round 2 drew
        monkeypatch.setattr(session, "attest", lambda nonces: stale)
        with pytest.raises(ProtocolError, match="replayed"):
            _round(proto, g, 2)
        assert proto.session is None  # the session is dropped; the next round attests afresh
        monkeypatch.undo()
        _round(proto, g, 3)


def test_client_accepts_only_a_quote_over_the_nonce_it_just_drew():
    with TEESession({"clip": 1.0}, processes=False) as s:
        a = TEEClient(1, verification_key=s.verification_key)
        b = TEEClient(2, verification_key=s.verification_key)
        qa, qb = s.attest([a.challenge(), b.challenge()])
        with pytest.raises(AttestationError, match="replayed"):  # made for another client's nonce
            a.encrypt(torch.ones(3), 1, quote=qb)
        assert b.encrypt(torch.ones(3), 1, quote=qb)
        with pytest.raises(AttestationError, match="challenge"):  # a nonce is good for one quote
            b.encrypt(torch.ones(3), 1, quote=qb)
        b.challenge()
        with pytest.raises(AttestationError, match="replayed"):  # last round's quote
            b.encrypt(torch.ones(3), 2, quote=qb)
        with pytest.raises(AttestationError, match="challenge"):  # no nonce drawn: nothing sent
            TEEClient(3, verification_key=s.verification_key).encrypt(torch.ones(3), 1, quote=qa)
