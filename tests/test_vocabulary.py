"""One vocabulary in code: identifiers are spelled the American way (``neighbor``, ``center``,
``centered``: the spelling of numpy, torch and the papers' code), prose the British way.

A British spelling in a name (a function, a parameter, a config key, a metric, an attribute)
makes users guess which one fedsafe took; prose in comments and docstrings is free. The check
reads the tokens of every Python file the project ships or tests: names, and the identifiers
(words with an underscore) inside strings, which is where config keys and metric names live.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BRITISH = re.compile(r"neighbour|centre|centred", re.IGNORECASE)
IDENTIFIER = re.compile(r"\b\w*_\w*\b")
STRING_TOKENS = {tokenize.STRING} | {getattr(tokenize, n) for n in ("FSTRING_MIDDLE",) if hasattr(tokenize, n)}


def british_identifiers(source: str) -> list[tuple[int, str]]:
    """(line, word) for each British-spelled identifier in ``source``: a name token, or a word
    with an underscore inside a string literal (f-strings' expressions included)."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME and BRITISH.search(tok.string):
            found.append((tok.start[0], tok.string))
        elif tok.type in STRING_TOKENS:
            words = IDENTIFIER.findall(tok.string)
            if tok.string.lstrip("rbRB").lower().startswith("f"):  # a 3.11 f-string: its {names}
                words += [w for expr in re.findall(r"\{([^}]*)\}", tok.string) for w in re.findall(r"\w+", expr)]
            found += [(tok.start[0], w) for w in words if BRITISH.search(w)]
    return found


def _python_files() -> list[Path]:
    return sorted(p for d in ("src", "tests", "benchmarks", "docs", "examples") for p in (ROOT / d).rglob("*.py"))


def test_the_check_finds_each_kind_of_identifier_and_spares_prose():
    source = (
        "def centred_sum(neighbours):  # the centred sum over neighbours\n"
        "    '''Prose: the centre of the neighbours.'''\n"
        "    row = {'secagg_neighbours': 1}\n"
        "    raise ValueError(f'bad {centre.shape}')\n"
    )
    assert [w for _, w in british_identifiers(source)] == ["centred_sum", "neighbours", "secagg_neighbours", "centre"]


def test_identifiers_are_spelled_the_american_way():
    found = {
        str(path.relative_to(ROOT)): hits
        for path in _python_files()
        if path != Path(__file__) and (hits := british_identifiers(path.read_text()))
    }
    assert not found, f"British-spelled identifiers (identifiers are American, prose British): {found}"
