"""The client's side: verify the enclave's quote, then encrypt the update to it.

A client pins two things: the platform's verification key (the simulated vendor root) and the
measurement of the enclave build it audited (:func:`expected_measurement`, computed from its
own copy of the enclave's sources). Each round it challenges the enclave with a nonce of its
own (:meth:`TEEClient.challenge`), and it sends nothing unless the quote it gets back verifies
against both and is over that nonce: a quote replayed by the host (an earlier round's, another
client's) is refused. A nonce serves one quote.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import torch
from torch import Tensor

from fedsafe.protocols.tee.attestation import (
    NONCE_BYTES,
    AttestationError,
    measure,
    verify_quote,
)
from fedsafe.protocols.tee.channel import client_binding, seal_for
from fedsafe.protocols.tee.wire import pack


@functools.lru_cache(maxsize=1)
def expected_measurement() -> bytes:
    """The measurement of the enclave code shipped with this fedsafe (what clients expect)."""
    return measure()


class TEEClient:
    def __init__(self, client_id: int, *, verification_key: bytes, measurement: bytes | None = None) -> None:
        self.client_id = int(client_id)
        self.verification_key = verification_key
        self.measurement = expected_measurement() if measurement is None else measurement
        self._nonce: bytes | None = None  # the outstanding challenge

    def challenge(self) -> bytes:
        """A fresh ``NONCE_BYTES``-byte nonce (``os.urandom``) for the enclave to quote over; the
        host relays it. It replaces any earlier one: only a quote over this nonce is accepted."""
        self._nonce = os.urandom(NONCE_BYTES)
        return self._nonce

    def encrypt(self, vector: Tensor, round_: int, *, quote: bytes) -> bytes:
        """The upload for ``round_``: ``vector`` as float32, sealed to the attested enclave key.
        ``quote`` must be over the nonce of the last :meth:`challenge`, which it uses up.
        Raises AttestationError (and sends nothing) if the quote does not verify."""
        nonce, self._nonce = self._nonce, None
        if nonce is None:
            raise AttestationError(
                f"client {self.client_id}: no outstanding challenge; draw a nonce with challenge() and "
                "have the enclave quote over it (a nonce serves one quote)"
            )
        enclave_public = verify_quote(
            quote, verification_key=self.verification_key, expected_measurement=self.measurement, nonce=nonce
        )
        x = np.ascontiguousarray(vector.detach().to("cpu", torch.float32).reshape(-1).numpy())
        context, aad = client_binding(self.measurement, round_, self.client_id, x.size)
        sealed = seal_for(enclave_public, memoryview(x).cast("B"), context=context, aad=aad)
        return pack({"client": self.client_id, "round": round_, "dim": int(x.size)}, blobs={"sealed": sealed})
