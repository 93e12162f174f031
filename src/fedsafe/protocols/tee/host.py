"""The untrusted host: starts the enclave and the two accelerators and relays bytes between them.

With ``processes=True`` each party is its own OS process (``multiprocessing`` with the
``spawn`` start method, so no memory is inherited from the host) connected to the host by a
pipe that carries only bytes in the ``wire`` format, written as ``length | bytes`` straight to
the pipe's descriptor and read in place into a buffer of the right size (multiprocessing's
``recv_bytes`` copies a message several times, which costs seconds per round at 512 MB). The only
pickling is multiprocessing's own spawn bootstrap (the target function and the pipe handle,
created before any party exists); platform secrets and settings travel as a frame on the pipe.
Every wait has a timeout; :meth:`TEESession.close` asks each child to shut down, then
terminates and joins it, so no zombie is left, and a finalizer does the same if the session is
garbage-collected unclosed.

With ``processes=False`` the same handler objects are called in-process through the same
frames (fast tests; ``Accelerator.last_received`` then shows what an accelerator saw).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import struct
import sys
import weakref
from typing import Any

import torch

from fedsafe.core.errors import ProtocolError
from fedsafe.protocols.crypto import KeyAgreementError
from fedsafe.protocols.tee.accelerator import Accelerator
from fedsafe.protocols.tee.attestation import AttestationError, SimulatedPlatform
from fedsafe.protocols.tee.channel import IntegrityError
from fedsafe.protocols.tee.enclave import DecodeError, Enclave
from fedsafe.protocols.tee.noise import NoiseError
from fedsafe.protocols.tee.wire import (
    WireError,
    error_frame,
    join,
    pack,
    pack_parts,
    unpack,
)

_ERRORS: dict[str, type[Exception]] = {
    "ProtocolError": ProtocolError, "IntegrityError": IntegrityError, "AttestationError": AttestationError,
    "NoiseError": NoiseError, "DecodeError": DecodeError, "WireError": WireError, "ValueError": ValueError,
    # a small-order X25519 key: a ValueError, as it was before it had its own class
    "KeyAgreementError": KeyAgreementError,
}


_LEN = struct.Struct("<Q")


def send_frame(conn: Any, frame: bytes | bytearray | memoryview | list) -> None:
    """Write a frame (one buffer or a list of buffers) as ``length (8 bytes) | bytes`` straight
    to the pipe's descriptor: no concatenation, no pickling."""
    parts = [memoryview(p).cast("B") for p in (frame if isinstance(frame, list) else [frame])]
    fd = conn.fileno()
    _write_all(fd, memoryview(_LEN.pack(sum(p.nbytes for p in parts))))
    for p in parts:
        _write_all(fd, p)


def _write_all(fd: int, mv: memoryview) -> None:
    while mv.nbytes:
        mv = mv[os.write(fd, mv) :]


def recv_frame(conn: Any) -> bytearray:
    """Read one frame written by :func:`send_frame` into a new writable buffer of exactly its
    size (read in place: no intermediate copies). Raises EOFError if the other end closed."""
    fd = conn.fileno()
    size = _LEN.unpack(_read_into(fd, bytearray(_LEN.size)))[0]
    return _read_into(fd, bytearray(size))


def _read_into(fd: int, buf: bytearray) -> bytearray:
    mv, got = memoryview(buf), 0
    while got < len(buf):
        n = os.readv(fd, [mv[got:]])
        if n == 0:
            raise EOFError("the other end of the pipe closed")
        got += n
    return buf


def checked(reply: bytes | bytearray | memoryview) -> tuple[dict[str, Any], dict, dict]:
    """Unpack a reply; an error frame is raised as its exception class (allowlisted by name;
    others become ProtocolError)."""
    head, arrays, blobs = unpack(reply)
    if "error" in head:
        name, msg = str(head["error"]), str(head.get("message", ""))
        cls = _ERRORS.get(name)
        raise (cls(msg) if cls is not None else ProtocolError(f"{name}: {msg}"))
    return head, arrays, blobs


class LocalEndpoint:
    """A party called in-process through frames."""

    def __init__(self, handler: Enclave | Accelerator, role: str) -> None:
        self.handler, self.role = handler, role
        self._reply: bytes | None = None

    def submit(self, request: bytes | list) -> None:
        self._reply = join(self.handler.handle(join(request)))

    def result(self, timeout: float) -> bytes | bytearray:
        reply, self._reply = self._reply, None
        if reply is None:
            raise ProtocolError(f"{self.role}: no request pending")
        return reply

    def call(self, request: bytes | list, timeout: float) -> bytes | bytearray:
        self.submit(request)
        return self.result(timeout)

    def close(self, timeout: float = 5.0) -> None:
        self.handler.handle(pack({"op": "shutdown"}))


class _AcceleratorActor:
    """Ray actor body: an :class:`Accelerator` answering frames (bytes in, bytes out)."""

    def __init__(self, index: int, device: str, threads: int) -> None:
        torch.set_num_threads(threads)
        self.handler = Accelerator(index, device)

    def handle(self, request: bytes) -> bytes:
        return bytes(join(self.handler.handle(request)))


class RayEndpoint:
    """An accelerator on a Ray actor (``tee.execution = "ray"``): on this machine or any node
    of a cluster, on a GPU with ``tee.accelerator_gpus``. Only frames (bytes) cross; the actor
    holds its own channel key, as a process would."""

    def __init__(self, index: int, device: str, threads: int, num_gpus: float) -> None:
        import ray

        self._ray = ray
        self.role = f"accelerator-{index}"
        actor = ray.remote(num_cpus=threads, num_gpus=num_gpus)(_AcceleratorActor)
        self.actor = actor.remote(index, device, threads)
        self._ref = None

    def submit(self, request: bytes | list) -> None:
        self._ref = self.actor.handle.remote(bytes(join(request)))

    def result(self, timeout: float) -> bytes:
        ref, self._ref = self._ref, None
        if ref is None:
            raise ProtocolError(f"{self.role}: no request pending")
        try:
            return self._ray.get(ref, timeout=timeout)
        except self._ray.exceptions.GetTimeoutError:
            raise ProtocolError(f"{self.role}: no reply within {timeout:g} s") from None
        except self._ray.exceptions.RayError as e:
            raise ProtocolError(f"{self.role}: actor failed: {type(e).__name__}") from None

    def call(self, request: bytes | list, timeout: float) -> bytes:
        self.submit(request)
        return self.result(timeout)

    def close(self, timeout: float = 5.0) -> None:
        self._ray.kill(self.actor)


class ProcessEndpoint:
    """A party in its own spawned process; see module doc."""

    def __init__(self, role: str, bootstrap: bytes) -> None:
        ctx = mp.get_context("spawn")
        self.role = role
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=serve, args=(child, role), name=f"fedsafe-tee-{role}", daemon=True)
        self.process.start()
        child.close()
        send_frame(self.conn, bootstrap)

    def submit(self, request: bytes | list) -> None:
        try:
            send_frame(self.conn, request)
        except (BrokenPipeError, OSError) as e:
            raise ProtocolError(f"{self.role} process is gone ({e}); exit code {self.process.exitcode}") from None

    def result(self, timeout: float) -> bytearray:
        try:
            ready = self.conn.poll(timeout)
        except (EOFError, OSError):
            ready = True
        if not ready:
            self.close(timeout=0.5)
            raise ProtocolError(f"{self.role} did not answer within {timeout:g} s; stopped it")
        try:
            return recv_frame(self.conn)
        except (EOFError, OSError):
            self.process.join(1.0)
            raise ProtocolError(
                f"{self.role} process exited (code {self.process.exitcode}). If this runs from a "
                "script, guard its entry point with `if __name__ == '__main__':` (the spawn start "
                "method re-imports the main module in every child)"
            ) from None

    def call(self, request: bytes | list, timeout: float) -> bytearray:
        self.submit(request)
        return self.result(timeout)

    def request_shutdown(self) -> None:
        """Ask the child to stop (it replies, then exits); does not wait."""
        if self.process.is_alive() and not self.conn.closed:
            try:
                send_frame(self.conn, pack({"op": "shutdown"}))
            except (EOFError, OSError):
                pass

    def join(self, timeout: float = 5.0) -> None:
        """Wait for the child to exit, terminating then killing it if it does not."""
        p = self.process
        p.join(timeout)
        if p.is_alive():
            p.terminate()
            p.join(2.0)
        if p.is_alive():
            p.kill()
            p.join()
        if not self.conn.closed:
            self.conn.close()

    def close(self, timeout: float = 5.0) -> None:
        self.request_shutdown()
        self.join(timeout)


def serve(conn: Any, role: str) -> None:
    """Child process main: build the party from the bootstrap frame, then answer frames until
    shutdown or the host's end of the pipe closes."""
    try:
        head, _, blobs = unpack(recv_frame(conn))
        if role == "enclave":
            torch.set_num_threads(1)  # the paper measures its SGX enclave on one thread
            handler: Enclave | Accelerator = Enclave(bytes(blobs["platform"]), head["settings"])
        else:
            torch.set_num_threads(int(head["threads"]))
            handler = Accelerator(int(head["index"]), str(head["device"]))
    except Exception as e:
        send_frame(conn, error_frame(e))
        conn.close()
        return
    send_frame(conn, pack({"ready": True}))
    while True:
        try:
            request = recv_frame(conn)
        except (EOFError, OSError):
            break
        reply = handler.handle(request)
        send_frame(conn, reply)
        del reply
        if unpack(request)[0].get("op") == "shutdown":
            break
    conn.close()
    # Skip interpreter teardown (seconds with torch loaded): nothing is left to flush but the
    # standard streams, and the parent is waiting to join.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _close_all(endpoints: list) -> None:
    # Ask every child first, then wait: they exit in parallel.
    for ep in endpoints:
        if isinstance(ep, ProcessEndpoint):
            ep.request_shutdown()
    for ep in endpoints:
        try:
            ep.join() if isinstance(ep, ProcessEndpoint) else ep.close()
        except Exception:  # best effort at teardown; a failed close must not hide others
            pass


class TEESession:
    """An enclave and two accelerators, wired and attested.

    ``settings`` go to the enclave (see ``Enclave``). The host keeps only the platform's
    verification key (what clients pin). It chooses no attestation nonce: :meth:`attest` relays
    the clients' own nonces to the enclave and their quotes back.
    """

    def __init__(
        self,
        settings: dict[str, Any],
        *,
        processes: bool,
        device: str = "auto",
        timeout: float = 600.0,
        keep_received: bool = False,
        accelerator_threads: int | None = None,
        execution: str = "serial",
        accelerator_gpus: float = 0.0,
    ) -> None:
        self.timeout = timeout
        platform = SimulatedPlatform()
        self.verification_key = platform.verification_key
        secrets = platform.secrets()
        del platform
        self.endpoints: list[LocalEndpoint | ProcessEndpoint] = []
        self._finalizer = weakref.finalize(self, _close_all, self.endpoints)
        try:
            threads = accelerator_threads or max(1, (os.cpu_count() or 2) // 2)
            if execution == "ray":
                if processes:
                    self.endpoints.append(ProcessEndpoint("enclave", pack({"settings": settings}, blobs={"platform": secrets})))
                    checked(self.endpoints[0].result(timeout))
                else:
                    self.endpoints.append(LocalEndpoint(Enclave(secrets, settings), "enclave"))
                for i in (1, 2):
                    self.endpoints.append(RayEndpoint(i, device, threads, accelerator_gpus))
            elif processes:
                self.endpoints.append(ProcessEndpoint("enclave", pack({"settings": settings}, blobs={"platform": secrets})))
                for i in (1, 2):
                    self.endpoints.append(ProcessEndpoint(
                        f"accelerator-{i}", pack({"index": i, "device": device, "threads": threads})))
                for ep in self.endpoints:  # the three start in parallel; wait for each
                    checked(ep.result(timeout))
            else:
                self.endpoints.append(LocalEndpoint(Enclave(secrets, settings), "enclave"))
                for i in (1, 2):
                    self.endpoints.append(LocalEndpoint(Accelerator(i, device, keep_received=keep_received),
                                                        f"accelerator-{i}"))
            self.processes = processes
            self.enclave, self.accelerators = self.endpoints[0], self.endpoints[1:]
            self.devices = []
            for i, acc in enumerate(self.accelerators, 1):
                head = self.call(acc, {"op": "public"})[0]
                self.devices.append(head["device"])
                mine = self.call(self.enclave, {"op": "connect", "accelerator": i, "public": head["public"]})[0]
                self.call(acc, {"op": "connect", "enclave_public": mine["public"]})
        except BaseException:
            self._finalizer()  # no half-started session outlives a failed start
            raise

    def attest(self, nonces: list[bytes]) -> list[bytes]:
        """The enclave's quotes over the clients' ``nonces``, one each, in order: one round
        trip for all clients."""
        blobs = self.call(self.enclave, {"op": "attest", "nonces": [bytes(n).hex() for n in nonces]})[2]
        return [bytes(blobs[f"q{k}"]) for k in range(len(nonces))]

    def call(self, ep, header: dict[str, Any], *, arrays=None, blobs=None):
        return checked(ep.call(pack_parts(header, arrays, blobs), self.timeout))

    @property
    def alive(self) -> bool:
        return self._finalizer.alive

    def close(self) -> None:
        """Shut every party down (idempotent)."""
        self._finalizer()

    def __enter__(self) -> TEESession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
