"""fedsafe: federated learning that is private against a curious server, robust against
poisoning clients, and that measures both.

The Python API (:mod:`fedsafe.api`) is exported here, imported on first use::

    import fedsafe
    result = fedsafe.Experiment("exp.toml", rounds=5).run()

So are the errors: every refusal fedsafe raises is a :class:`FedsafeError`
(:mod:`fedsafe.core.errors`), so ``except fedsafe.FedsafeError`` catches them all.
"""

from fedsafe.core.lazy import lazy_exports

__version__ = "0.1.0"

# Public names -> the submodule defining each, imported on first use (fedsafe.core.lazy), so
# `import fedsafe` stays cheap and any layer may import the package itself.
_EXPORTS = {
    "CheckpointError": "core.errors",
    "ConfigError": "core.errors",
    "DataFormatError": "data.errors",
    "DivergedError": "core.errors",
    "Experiment": "api",
    "ExperimentConfig": "config",
    "FederatedDataset": "data.dataset",
    "Federation": "engine.federation",
    "FedsafeError": "core.errors",
    "ModelError": "models.custom",
    "Plugin": "core.plugins",
    "ProtocolError": "core.errors",
    "RegistryError": "core.registry",
    "ReportError": "report.runs",
    "RequirementError": "core.errors",
    "Result": "api",
    "RunDirError": "core.errors",
    "RunStopped": "engine.run",
    "TensorBoard": "api",
    "check_model": "models.custom",
    "federated_data": "api",
    "load_model": "api",
    "register_attack": "api",
    "register_dataset": "api",
    "register_model": "models.build",
    "register_preaggregator": "api",
    "register_rule": "api",
    "sweep": "api",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
