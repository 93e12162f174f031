"""Privacy: client-level differential privacy (the ``dp`` package: ``mechanisms`` — clipping,
noise placements, adaptive clipping; ``accounting`` — ε over dp-accounting's DpEvents;
``config`` — the ``[dp]`` section; ``plugin`` — DP-FedAvg in the round), and the cryptographic protocols that decide who sees what (``secagg``, ``he``, ``tee``,
``inherent``). ``crypto`` holds the X25519 / HKDF / AES-GCM / AES-CTR / Ed25519 primitives that
``secagg`` and ``tee`` share."""
