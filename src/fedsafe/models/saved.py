"""The trained model a run leaves behind, and rebuilding it as a ``torch.nn.Module``.

At the end of a run fedsafe writes ``model.pt``, the evaluated model's ``state_dict`` (the
moving average when ``server.ema`` is set, else the global model), saved with ``torch.save`` and
loadable with ``torch.load(path, weights_only=True)``, and ``model.json``, what is needed to
rebuild the module without loading the dataset (the model section of the config, the input
shape and the number of classes). One line rebuilds it::

    model = fedsafe.models.load_trained("runs/default/mean")

A run of a user's own module (``fedsafe.Experiment(model=...)``) records the module's class
instead of a config (``"model": {"custom": "package.module.Class"}``): fedsafe cannot rebuild
an arbitrary module, so ``load_trained(run_dir, model=MyNet())`` loads the weights into a fresh
instance the caller builds, after checking that its parameter names and shapes match.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

from fedsafe.models.build import build_model
from fedsafe.models.config import ModelConfig

MODEL = "model.pt"
MODEL_META = "model.json"


def save_trained(
    model: nn.Module, out_dir: Path, cfg: ModelConfig | None, input_shape: tuple[int, ...], num_classes: int,
    *, privacy: dict[str, str] | None = None,
) -> Path:
    """Write ``model.pt`` (``model``'s state_dict) and ``model.json`` into ``out_dir``
    (``cfg`` None: a user's own module, recorded by its class). ``privacy``: keys recorded in
    ``model.json`` beside the model (a run with a privacy mechanism records ``randomness``,
    and, for seeded noise, ``privacy_warning``)."""
    out = Path(out_dir)
    kind = type(model)
    meta = {
        "model": cfg.model_dump(mode="json") if cfg is not None else {"custom": f"{kind.__module__}.{kind.__qualname__}"},
        "input_shape": list(input_shape),
        "num_classes": int(num_classes),
        "parameters": sum(p.numel() for p in model.parameters()),
        **(privacy or {}),
    }
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, out / MODEL)
    (out / MODEL_META).write_text(json.dumps(meta, indent=2) + "\n")
    return out / MODEL


def load_trained(run_dir: str | Path, model: nn.Module | None = None) -> nn.Module:
    """The trained module of a finished run (in eval mode), rebuilt from ``model.json`` and
    ``model.pt`` in ``run_dir`` (a variant's own directory for experiments with variants).

    ``model``: for a run of a user's own module, an instance of it to load the weights into
    (a copy is returned; the instance is not modified); for built-in models it may be omitted."""
    run = Path(run_dir)
    meta_path, weights = run / MODEL_META, run / MODEL
    if not meta_path.is_file() or not weights.is_file():
        raise FileNotFoundError(
            f"{run}: no {MODEL} / {MODEL_META}; a finished fedsafe run directory holds both "
            "(for an experiment with variants, pass one variant's directory)"
        )
    meta = json.loads(meta_path.read_text())
    state = torch.load(weights, weights_only=True, map_location="cpu")
    custom = meta["model"].get("custom")
    if model is None:
        if custom is not None:
            raise ValueError(
                f"{run}: the run trained a user's own module ({custom}); pass an instance of it: "
                "load_trained(run_dir, model=YourModule(...))"
            )
        module = build_model(ModelConfig.model_validate(meta["model"]), tuple(meta["input_shape"]), int(meta["num_classes"]))
    else:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        module = copy.deepcopy(model)
        have = {k: tuple(v.shape) for k, v in module.state_dict().items()}
        saved = {k: tuple(v.shape) for k, v in state.items()}
        if have != saved:
            diff = sorted(set(have.items()) ^ set(saved.items()))[:4]
            raise ValueError(
                f"{run}: the given {type(model).__name__} does not match the saved weights "
                f"(name, shape) differences: {diff}"
            )
    module.load_state_dict(state)
    return module.eval()
