"""The federation loop and how it runs: :class:`~fedsafe.engine.federation.Federation`, client
work and backends, Ray execution, sampling, server optimizers, checkpoints, metrics, run
directories and sweeps (layer 4 of docs/architecture.md). Import the submodules directly."""
