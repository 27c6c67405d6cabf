"""The path the arguments of ``aiayn translate`` take from ``cli/translate.py`` into
``decode/beam.py``, counted: stops, modules and climbs (issue 67's yardstick).

    PYTHONPATH=src .venv/bin/python scripts/dev/front_door_path.py --checkpoint CKPT

Runs ``aiayn translate --checkpoint CKPT --beam 2 --nbest 2`` on one line under
``sys.setprofile`` and, until ``beam_search`` is first entered, records every call of a function
of the package that receives the arguments: the parsed ``argparse.Namespace`` or a record
built from it (``SearchRequest``, ``DecodeConfig``, ``SampleConfig``, ``Batching``, the
``aiayn.Translator``, the command line's stream and outputs). Each such call is a *stop*;
*calls* counts them; a *stop* is a visit to a module (consecutive calls in one module are one
stop, as a reader following the arguments turns one page); *modules* are the distinct modules
visited; a *climb* is a stop in a layer above the previous stop's (layers as docs/layout.md:
the command line, the applications, the library, the foundations), i.e. the arguments going
back up before coming down again. A record's own checks (``__post_init__``) and ``self`` are
not counted: they are the record, not a stop. Prints the numbers and the calls in order,
``--json`` as one object.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
from pathlib import Path

LAYERS = {"cli": 3, "translator": 2, "serve": 2, "workflow": 2, "decode": 1, "evaluate": 1}
CARRIERS = {
    "Namespace",
    "SearchRequest",
    "DecodeConfig",
    "SampleConfig",
    "Batching",
    "Translator",
    "TextStream",
    "Outputs",
}

DOORS = {"__init__", "request"}  # aiayn.Translator's: handed the options by keyword


def _layer(module: str) -> int:
    top = module.split("/")[0].removesuffix(".py")
    return LAYERS.get(top, 1 if "/" in module else 0)


def _carries(frame) -> bool:
    """Whether a call receives the arguments (``self`` does not count: a method of the
    Translator is a stop only when it is handed the arguments or a record of them)."""
    code = frame.f_code
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    if code.co_filename.endswith("aiayn/translator.py") and code.co_name in DOORS:
        return True  # the options arrive as keywords: their values are plain
    if code.co_name.startswith("__") and code.co_name != "__call__":
        return False  # a record's own checks (__post_init__) are the record, not a stop
    given = [frame.f_locals.get(n) for n in names if n not in ("self", "cls")]
    return any(type(v).__name__ in CARRIERS for v in given)


def trace(checkpoint: str) -> list[tuple[str, str]]:
    """(module relative to the package, function) of every stop, in order."""
    import aiayn
    from aiayn.cli.main import main

    package = str(Path(aiayn.__file__).parent) + "/"
    stops: list[tuple[str, str]] = []
    done = False

    def profile(frame, event, arg):
        nonlocal done
        if done or event != "call" or not frame.f_code.co_filename.startswith(package):
            return
        module = frame.f_code.co_filename[len(package) :]
        if module == "cli/translate.py" and frame.f_code.co_name == "_translate":
            stops.append((module, "_translate"))  # the command starts: the path starts
        elif not stops:
            return
        elif module == "decode/beam.py" and frame.f_code.co_name == "beam_search":
            stops.append((module, "beam_search"))
            done = True
        elif _carries(frame):
            stops.append((module, frame.f_code.co_name))

    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "in.txt"
        source.write_text("In the beginning God created the heaven and the earth.\n")
        argv = ["translate", "--checkpoint", checkpoint, "--input", str(source), "--quiet"]
        stdout, sys.stdout = sys.stdout, io.StringIO()
        sys.setprofile(profile)
        try:
            main([*argv, "--beam", "2", "--nbest", "2", "--workers", "1"])
        finally:
            sys.setprofile(None)
            sys.stdout = stdout
    return stops


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    stops = trace(args.checkpoint)
    visits = [m for i, (m, _) in enumerate(stops) if i == 0 or stops[i - 1][0] != m]
    layers = [_layer(m) for m in visits]
    climbs = sum(1 for a, b in zip(layers, layers[1:]) if b > a)
    counted = {
        "calls": len(stops),
        "stops": len(visits),
        "modules": len(set(visits)),
        "climbs": climbs,
        "visits": visits,
    }
    if args.json:
        print(json.dumps({**counted, "path": [f"{m}:{f}" for m, f in stops]}))
        return
    print(counted)
    for module, function in stops:
        print(f"  {module}:{function}")


if __name__ == "__main__":
    main()
