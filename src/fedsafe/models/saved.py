"""The trained model a run leaves behind, and rebuilding it as a ``torch.nn.Module``.

At the end of a run fedsafe writes ``model.pt``, the evaluated model's ``state_dict`` (the
moving average when ``server.ema`` is set, else the global model), saved with ``torch.save`` and
loadable with ``torch.load(path, weights_only=True)``, and ``model.json``, what is needed to
rebuild the module without loading the dataset (the model section of the config, the input
shape and the number of classes). One line rebuilds it::

    model = fedsafe.models.load_trained("runs/default/mean")
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from fedsafe.models.build import build_model
from fedsafe.models.config import ModelConfig

MODEL = "model.pt"
MODEL_META = "model.json"


def save_trained(model: nn.Module, out_dir: Path, cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> Path:
    """Write ``model.pt`` (``model``'s state_dict) and ``model.json`` into ``out_dir``."""
    out = Path(out_dir)
    meta = {
        "model": cfg.model_dump(mode="json"),
        "input_shape": list(input_shape),
        "num_classes": int(num_classes),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, out / MODEL)
    (out / MODEL_META).write_text(json.dumps(meta, indent=2) + "\n")
    return out / MODEL


def load_trained(run_dir: str | Path) -> nn.Module:
    """The trained module of a finished run (in eval mode), rebuilt from ``model.json`` and
    ``model.pt`` in ``run_dir`` (a variant's own directory for experiments with variants)."""
    run = Path(run_dir)
    meta_path, weights = run / MODEL_META, run / MODEL
    if not meta_path.is_file() or not weights.is_file():
        raise FileNotFoundError(
            f"{run}: no {MODEL} / {MODEL_META}; a finished fedsafe run directory holds both "
            "(for an experiment with variants, pass one variant's directory)"
        )
    meta = json.loads(meta_path.read_text())
    module = build_model(ModelConfig.model_validate(meta["model"]), tuple(meta["input_shape"]), int(meta["num_classes"]))
    module.load_state_dict(torch.load(weights, weights_only=True, map_location="cpu"))
    return module.eval()
