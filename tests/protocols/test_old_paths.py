"""The old import paths of the protocols (``fedsafe.privacy.secagg``, ``.he``, ``.tee``,
``.crypto``), kept for one release: each gives the very module object of its new path under
``fedsafe.protocols``, with a ``DeprecationWarning`` naming that path; ``import fedsafe.privacy``
stays light."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGES = ("secagg", "he", "tee")


def _moved() -> dict[str, str]:
    """old module name -> new module name, for every module that moved (packages included)."""
    out = {"fedsafe.privacy.crypto": "fedsafe.protocols.crypto"}
    for pkg in PACKAGES:
        for path in sorted((SRC / "fedsafe" / "protocols" / pkg).glob("*.py")):
            sub = "" if path.stem == "__init__" else f".{path.stem}"
            out[f"fedsafe.privacy.{pkg}{sub}"] = f"fedsafe.protocols.{pkg}{sub}"
    return out


MOVED = _moved()


def _fresh(code: str) -> str:
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return res.stdout


def test_every_moved_module_is_listed():
    assert len(MOVED) >= 40 and "fedsafe.privacy.he.bfv" in MOVED and "fedsafe.privacy.tee.enclave" in MOVED
    assert not (SRC / "fedsafe" / "privacy" / "secagg").exists()
    assert not (SRC / "fedsafe" / "privacy" / "crypto.py").exists()


def test_every_old_path_is_the_new_module_and_warns():
    # a fresh interpreter, so every old name is imported for the first time, before its new one
    code = (
        "import importlib, json, sys, warnings\n"
        "out = {}\n"
        f"for old, new in json.loads({json.dumps(json.dumps(MOVED))}).items():\n"
        "    with warnings.catch_warnings(record=True) as w:\n"
        "        warnings.simplefilter('always')\n"
        "        mod = importlib.import_module(old)\n"
        "    out[old] = {'same': mod is importlib.import_module(new) and sys.modules[old] is sys.modules[new],\n"
        "                'name': mod.__name__, 'spec': mod.__spec__.name,\n"
        "                'warnings': [str(x.message) for x in w if issubclass(x.category, DeprecationWarning)]}\n"
        "print(json.dumps(out))\n"
    )
    out = json.loads(_fresh(code))
    for old, new in MOVED.items():
        got = out[old]
        assert got["same"], old
        assert got["name"] == new and got["spec"] == new, (old, got)
        assert any(f"has moved to {new};" in m for m in got["warnings"]), (old, got["warnings"])


def test_old_names_in_this_process():
    import fedsafe.protocols.he.bfv as bfv
    import fedsafe.protocols.secagg.protocol as protocol
    from fedsafe.protocols.crypto import hkdf
    from fedsafe.protocols.secagg import SecAggConfig

    for old in ("fedsafe.privacy.secagg.protocol", "fedsafe.privacy.he.bfv", "fedsafe.privacy.crypto"):
        sys.modules.pop(old, None)  # the alias only: the module itself stays imported
    with pytest.warns(DeprecationWarning) as rec:
        import fedsafe.privacy.secagg.protocol as old_protocol
    assert old_protocol is protocol
    assert any("has moved to fedsafe.protocols.secagg.protocol;" in str(r.message) for r in rec)
    assert {r.filename for r in rec} == {__file__}  # the importing line, not importlib
    with pytest.warns(DeprecationWarning) as rec:
        import fedsafe.privacy.he.bfv as old_bfv
    assert old_bfv is bfv
    assert any("has moved to fedsafe.protocols.he.bfv;" in str(r.message) for r in rec)
    with pytest.warns(DeprecationWarning, match=r"fedsafe\.protocols\.crypto"):
        from fedsafe.privacy.crypto import hkdf as old_hkdf
    assert old_hkdf is hkdf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from fedsafe.privacy.secagg import SecAggConfig as OldConfig
        import fedsafe.privacy

        assert fedsafe.privacy.tee is sys.modules["fedsafe.protocols.tee"]  # an attribute too
        # a pickle naming the old module (written before the move) loads the new class
        assert pickle.loads(b"cfedsafe.privacy.secagg.config\nSecAggConfig\n.") is SecAggConfig
    assert OldConfig is SecAggConfig


def test_unknown_old_names_still_fail():
    import fedsafe.privacy

    with pytest.raises(ModuleNotFoundError):
        import fedsafe.privacy.secagg.no_such_module  # noqa: F401
    with pytest.raises(ModuleNotFoundError):
        import fedsafe.privacy.no_such_module  # noqa: F401
    with pytest.raises(AttributeError):
        fedsafe.privacy.no_such_name  # noqa: B018


def test_import_privacy_is_light():
    code = "import sys, fedsafe.privacy; print(sorted(m for m in sys.modules if m.startswith(('fedsafe', 'torch'))))"
    assert json.loads(_fresh(code).replace("'", '"')) == ["fedsafe", "fedsafe.core", "fedsafe.core.lazy", "fedsafe.privacy"]
    code = "import sys, fedsafe.protocols; print('torch' in sys.modules, 'fedsafe.privacy' in sys.modules)"
    assert _fresh(code).split() == ["False", "False"]
