"""BFV backend: emulator == BFV == numpy sort, bit for bit; the server cannot decrypt; malformed
uploads are rejected naming the node.

Each BFV evaluation works on whole ciphertexts (N = 16384 slots), so these run few, small
circuits (n = 3..4); the n = 5 cases are marked slow.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("tenseal")

from fedsafe.protocols.he import bfv  # noqa: E402
from fedsafe.protocols.he.bfv import (  # noqa: E402
    EncryptedUpload,
    HENode,
    HEServer,
    MalformedUploadError,
    NodeKeyring,
    ServerKeys,
    to_bytes,
)
from fedsafe.protocols.he.emulator import emulate_trimmed_sum, reference_trimmed_sum  # noqa: E402
from fedsafe.protocols.he.encoding import Quantizer  # noqa: E402
from fedsafe.protocols.he.params import HEParameterError, band, plan_hts  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)


_PARTIES: dict = {}


def parties(n, rule, f, delta, digits=None):
    """(plan, keyring, node, server) cached per configuration (key generation takes ~0.3 s)."""
    key = (n, rule, f, delta, digits)
    if key not in _PARTIES:
        lo, hi = band(n, rule, f)
        plan = plan_hts(n, lo, hi, delta, digits=digits)
        keyring = NodeKeyring(plan.params)
        node = HENode(keyring, plan, Quantizer(delta, 1.0))
        _PARTIES[key] = (plan, keyring, node, HEServer(keyring.server_keys()))
    return _PARTIES[key]


def _values(plan, n, d, seed):
    rng = np.random.default_rng(seed)
    m = plan.digits.max_value
    a = rng.integers(0, m + 1, size=(n, d))
    a[:, :6] = rng.integers(0, 2, size=(n, 6)) * m  # extremes only
    a[:, 6:12] = a[0, 6:12]  # all tied
    a[:2, 12:16] = m  # ties at the top
    return a


def _check_three_way(n, rule, f, delta, digits=None, d=40):
    plan, keyring, node, server = parties(n, rule, f, delta, digits)
    a = _values(plan, n, d, seed=n + delta)
    uploads = [node.encrypt_shifted(i, a[i]) for i in range(n)]
    result = server.trimmed_sum(uploads, plan)
    got = node.decrypt(result)
    emu = emulate_trimmed_sum(a, plan.spec, plan.digits)
    lo, hi = band(n, rule, f)
    ref = reference_trimmed_sum(a - plan.spec.offset, lo, hi)
    assert got.shape == (d,)
    assert np.array_equal(emu, ref)
    assert np.array_equal(got, emu)
    budget = keyring.noise_budget(result.blocks[0])
    assert budget > 0
    # the noise model is conservative: the real budget is at least the modelled one
    assert budget >= result.stats["model_budget_bits"] - 1
    return plan, result


@pytest.mark.parametrize(
    "n,rule,f,delta,digits",
    [
        (3, "trimmed_mean", 1, 2, None),  # one digit
        (4, "median", 0, 2, None),  # even n: the two middle values
        (3, "trimmed_mean", 1, 4, 2),  # two digit planes (Neg and Zero per digit)
    ],
)
def test_bfv_equals_emulator_equals_sort(n, rule, f, delta, digits):
    plan, result = _check_three_way(n, rule, f, delta, digits)
    assert plan.digits.digits == (digits or plan.digits.digits)
    assert len(result.blocks) == 1


@pytest.mark.slow
@pytest.mark.parametrize("n,rule,f,delta", [(5, "trimmed_mean", 1, 4), (5, "trimmed_mean", 2, 3), (6, "median", 0, 3)])
def test_bfv_equals_emulator_larger(n, rule, f, delta):
    _check_three_way(n, rule, f, delta)


def test_f0_is_the_plain_sum_over_several_blocks():
    plan, keyring, node, server = parties(3, "trimmed_mean", 0, 3)
    d = plan.slots + 5  # two blocks, the second nearly empty
    a = _values(plan, 3, d, seed=0)
    result = server.trimmed_sum([node.encrypt_shifted(i, a[i]) for i in range(3)], plan)
    assert len(result.blocks) == 2
    assert np.array_equal(node.decrypt(result), (a - plan.spec.offset).sum(axis=0))


def test_node_encoder_clamps_its_own_values():
    plan, keyring, node, server = parties(3, "trimmed_mean", 1, 2)
    x = np.array([[5.0, -5.0, 0.2, np.nan], [0.9, -0.9, 0.0, np.inf], [-3.0, 0.6, -0.4, -np.inf]])
    result = server.trimmed_sum([node.encrypt(i, x[i]) for i in range(3)], plan)
    q = Quantizer(2, 1.0).quantize(x)  # {-1, 0, 1}
    assert np.array_equal(node.decrypt(result), np.median(q, axis=0).astype(np.int64))


def test_duplicated_upload_is_rerandomised_not_refused():
    plan, keyring, node, server = parties(3, "trimmed_mean", 1, 2)
    a = _values(plan, 3, 20, seed=3)
    ups = [node.encrypt_shifted(i, a[i]) for i in range(3)]
    copy = dataclasses.replace(ups[0], client_id=2)  # a Byzantine node replays node 0's bytes
    result = server.trimmed_sum([ups[0], ups[1], copy], plan)
    b = a.copy()
    b[2] = a[0]
    assert np.array_equal(node.decrypt(result), reference_trimmed_sum(b - plan.spec.offset, 1, 1))


# ----------------------------------------------------------------------------- keys and parties


def _walk(obj, seen=None):
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    yield obj
    children = []
    if isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, (list, tuple, set)):
        children = list(obj)
    elif hasattr(obj, "__dict__"):
        children = list(vars(obj).values())
    elif hasattr(obj, "__slots__"):
        children = [getattr(obj, s) for s in obj.__slots__ if hasattr(obj, s)]
    for c in children:
        yield from _walk(c, seen)


def test_server_holds_no_secret_key_and_cannot_decrypt():
    plan, keyring, node, server = parties(3, "trimmed_mean", 1, 2)
    assert isinstance(server.keys, ServerKeys)
    assert {f.name for f in dataclasses.fields(ServerKeys)} == {"params", "public_key", "relin_keys"}
    objects = list(_walk(server))
    assert not any(isinstance(o, bfv.seal.SecretKey) for o in objects)
    assert not any(isinstance(o, (NodeKeyring, bfv.seal.Decryptor)) for o in objects)
    assert not hasattr(server, "decrypt")
    secret = to_bytes(keyring._secret_key)
    assert secret not in server.keys.public_key and secret not in server.keys.relin_keys
    # everything the server could build from its material: a decryptor needs a secret key
    with pytest.raises(TypeError):
        bfv.seal.Decryptor(server._state.ctx.context, server._state.public)
    with pytest.raises(TypeError, match="ServerKeys"):
        HEServer(keyring)


def test_result_decrypts_only_under_the_nodes_key():
    plan, keyring, node, server = parties(3, "trimmed_mean", 1, 2)
    a = _values(plan, 3, 30, seed=4)
    result = server.trimmed_sum([node.encrypt_shifted(i, a[i]) for i in range(3)], plan)
    other = HENode(NodeKeyring(plan.params), plan, Quantizer(2, 1.0))  # same parameters, other key
    assert not np.array_equal(other.decrypt(result), node.decrypt(result))


# ----------------------------------------------------------------------------- bad input


def test_malformed_uploads_are_rejected_naming_the_node():
    plan, keyring, node, server = parties(3, "trimmed_mean", 1, 2)
    a = _values(plan, 3, 10, seed=5)
    good = [node.encrypt_shifted(i, a[i]) for i in range(3)]

    def rejected(bad, match):
        with pytest.raises(MalformedUploadError, match=match) as info:
            server.trimmed_sum([good[0], good[1], bad], plan)
        assert info.value.client_id == bad.client_id
        assert f"client {bad.client_id}" in str(info.value)

    rejected(dataclasses.replace(good[2], client_id=17, fingerprint="0" * 16), "other parameters")
    rejected(dataclasses.replace(good[2], client_id=18, length=11), "encodes 11 coordinates")
    rejected(dataclasses.replace(good[2], client_id=19, ciphertexts=good[2].ciphertexts * 2), "2 ciphertext blocks")
    rejected(dataclasses.replace(good[2], client_id=20, ciphertexts=((),)), "0 digit ciphertexts")
    rejected(dataclasses.replace(good[2], client_id=21, ciphertexts=((b"garbage" * 10,),)), "not a valid ciphertext")
    truncated = good[2].ciphertexts[0][0][:-100]
    rejected(dataclasses.replace(good[2], client_id=22, ciphertexts=((truncated,),)), "not a valid ciphertext")


def test_ciphertext_from_other_parameters_is_rejected_even_with_a_forged_fingerprint():
    plan, keyring, node, server = parties(3, "trimmed_mean", 1, 2)
    other_plan, other_keyring, other_node, _ = parties(3, "trimmed_mean", 1, 4, 2)
    assert other_plan.params != plan.params
    a = _values(plan, 3, 10, seed=6)
    good = [node.encrypt_shifted(i, a[i]) for i in range(3)]
    foreign = other_node.encrypt_shifted(9, np.zeros(10, dtype=np.int64))
    with pytest.raises(MalformedUploadError, match="other parameters"):
        server.trimmed_sum([good[0], good[1], foreign], plan)
    forged = EncryptedUpload(9, good[2].fingerprint, 10, ((foreign.ciphertexts[0][0],),))
    with pytest.raises(MalformedUploadError, match="client 9: block 0 digit 0 is not a valid ciphertext"):
        server.trimmed_sum([good[0], good[1], forged], plan)


def test_wrong_number_of_uploads_and_mismatched_plan_are_refused():
    plan, keyring, node, server = parties(3, "trimmed_mean", 1, 2)
    ups = [node.encrypt_shifted(i, np.zeros(4, dtype=np.int64)) for i in range(2)]
    with pytest.raises(HEParameterError, match="plan is for 3 inputs"):
        server.trimmed_sum(ups, plan)
    other_plan = parties(3, "trimmed_mean", 1, 4, 2)[0]
    with pytest.raises(HEParameterError, match="different BFV parameters"):
        server.validate(ups, other_plan)
