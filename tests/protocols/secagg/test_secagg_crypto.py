import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from fedsafe.protocols.secagg import SecAggError, crypto
from fedsafe.protocols.secagg.graph import complete_graph, harary_graph


@pytest.mark.parametrize("dtype", ["<u4", "<u8"])
def test_mask_expansion_is_aes256_ctr_keystream_of_the_seed(dtype):
    seed = os.urandom(32)
    d = 1001
    ref = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor().update(bytes(d * np.dtype(dtype).itemsize))
    expand = crypto.MaskExpander(d, np.dtype(dtype))
    first = expand(seed).copy()
    assert first.tobytes() == ref
    assert np.array_equal(expand(os.urandom(32)), first) is False
    assert np.array_equal(expand(seed), first)  # pure function of the seed
    assert np.array_equal(crypto.expand_mask(seed, d, np.dtype(dtype)), first)


def test_mask_words_look_uniform():
    m = crypto.expand_mask(os.urandom(32), 200_000, np.dtype("<u4"))
    # each of the 32 bits is set about half the time
    bits = ((m[:, None] >> np.arange(32, dtype=np.uint32)) & 1).mean(0)
    assert np.all(np.abs(bits - 0.5) < 0.01)


def test_key_agreement_is_symmetric_and_separated_by_purpose_session_and_pair():
    a, b = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    s = os.urandom(16)
    kab = crypto.agree(a, crypto.public_bytes(b), session=s, purpose="mask", a=1, b=2)
    kba = crypto.agree(b, crypto.public_bytes(a), session=s, purpose="mask", a=2, b=1)
    assert kab == kba and len(kab) == 32
    assert crypto.agree(a, crypto.public_bytes(b), session=s, purpose="enc", a=1, b=2) != kab
    assert crypto.agree(a, crypto.public_bytes(b), session=os.urandom(16), purpose="mask", a=1, b=2) != kab
    assert crypto.agree(a, crypto.public_bytes(b), session=s, purpose="mask", a=1, b=3) != kab


def test_small_order_public_key_is_rejected_with_the_peer_named():
    a = X25519PrivateKey.generate()
    with pytest.raises(SecAggError, match="from client 7, field .s_pk.") as e:
        crypto.agree(a, bytes(32), session=bytes(16), purpose="mask", a=1, b=7, peer=7, field="s_pk")
    assert e.value.sender == 7 and e.value.field == "s_pk"


def test_sealed_shares_authenticate_everything():
    key = os.urandom(32)
    ct = crypto.seal(key, 1, 2, b"secret share", b"aad")
    assert crypto.open_sealed(key, 1, 2, ct, b"aad", field="f") == b"secret share"
    tampered = bytes([ct[0] ^ 1]) + ct[1:]
    for args in [(key, 1, 2, tampered, b"aad"), (key, 2, 1, ct, b"aad"), (key, 1, 2, ct, b"other"),
                 (os.urandom(32), 1, 2, ct, b"aad")]:
        with pytest.raises(SecAggError, match="authentication"):
            crypto.open_sealed(*args, field="f")


def test_seeded_randomness_is_deterministic_per_label():
    a = crypto.SeededRandomness(5, "client/1").bytes(64)
    assert a == crypto.SeededRandomness(5, "client/1").bytes(64)
    assert a != crypto.SeededRandomness(5, "client/2").bytes(64)
    assert a != crypto.SeededRandomness(6, "client/1").bytes(64)
    r = crypto.SeededRandomness(5, "x")
    assert r.bytes(10) + r.bytes(10) == crypto.SeededRandomness(5, "x").bytes(20)


@pytest.mark.parametrize("n,k", [(10, 2), (11, 4), (50, 10), (100, 14), (7, 6)])
def test_harary_graph_is_k_regular_and_symmetric(n, k):
    ids = [3 * i + 1 for i in range(n)]
    g = harary_graph(ids, k, np.random.default_rng(0))
    kk = min(k, n - 1)
    assert sorted(g) == ids
    for u, nb in g.items():
        assert len(nb) == kk and u not in nb and list(nb) == sorted(nb)
        assert all(u in g[v] for v in nb)
    assert harary_graph(ids, k, np.random.default_rng(0)) == g
    if k < n - 1:
        assert harary_graph(ids, k, np.random.default_rng(1)) != g


def test_complete_graph():
    g = complete_graph([5, 1, 3])
    assert g == {1: (3, 5), 3: (1, 5), 5: (1, 3)}
