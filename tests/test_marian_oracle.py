"""Oracle: a model Marian trained, imported (``aiayn import``), translates as Marian does.

Opt-in (``pytest -m oracle``), and skipped unless two variables name Marian and its models:

    python3 -m venv /work/marianvenv && /work/marianvenv/bin/pip install pymarian==1.12.42
    AIAYN_MARIAN=/work/marianvenv/bin/pymarian AIAYN_MARIAN_MODELS=work/marian/tied:work/marian/untied \\
        .venv/bin/python -m pytest -m oracle tests/test_marian_oracle.py

Each directory of ``AIAYN_MARIAN_MODELS`` (``os.pathsep``-separated) is a Marian model directory
(``model.npz``, its ``*decoder.yml`` and vocabularies; docs/import.md trains two on the bundled
corpus). ``pymarian decode`` translates the first 200 sentences of the bundled test split, one
sentence a batch (Marian's length limit follows its batch), beam 4, ``--normalize 0.6``, and
prints its pieces and each one's log-probability; ours, under ``--search-rules marian``, must
give the same pieces for every sentence, and our model the same log-probabilities (of Marian's
outputs, eos included) within 1e-4.
"""

import os
import subprocess
from pathlib import Path

import pytest
from _export_models import corpus_lines

from aiayn.checkpoint import load_translator
from aiayn.decode import DecodeConfig, SearchRequest, decode_ids
from aiayn.decode.rules import SEARCH_RULES
from aiayn.decode.score import score_ids
from aiayn.export.marian_npz import decoder_yml, import_marian_npz

SENTENCES, BEAM, NORMALIZE = 200, 4, 0.6
MODELS = [Path(p) for p in os.environ.get("AIAYN_MARIAN_MODELS", "").split(os.pathsep) if p]

pytestmark = [
    pytest.mark.oracle,
    pytest.mark.skipif(
        not (os.environ.get("AIAYN_MARIAN") and MODELS),
        reason="Marian runs in its own venv: set AIAYN_MARIAN (its pymarian command) and "
        "AIAYN_MARIAN_MODELS (model directories; tests/test_marian_oracle.py, docs/import.md)",
    ),
]


def marian_decode(
    directory: Path, sources: list[str], workdir: Path
) -> list[tuple[list[str], list[float]]]:
    """Marian's best output of each source: its pieces (no </s>) and the log-probability of each
    piece and of the final </s> (``--word-scores``)."""
    (workdir / "in.txt").write_text("\n".join(sources) + "\n", encoding="utf-8")
    command = [
        os.environ["AIAYN_MARIAN"], "decode", "-c", str(decoder_yml(directory)),
        "--models", str(next(directory.glob("*.npz")).resolve()),
        "--input", str(workdir / "in.txt"), "--cpu-threads", "1", "--mini-batch", "1",
        "--maxi-batch", "1", "--beam-size", str(BEAM), "--normalize", str(NORMALIZE),
        "--word-penalty", "0", "--max-length-factor", "3", "--word-scores", "--no-spm-decode",
        "--quiet",
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, cwd=directory)  # its paths
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout
    found = []
    for line in lines.splitlines():
        text, _, scores = line.partition(" ||| WordScores= ")
        found.append((text.split(), [float(s) for s in scores.split()]))
    assert len(found) == len(sources), lines[-2000:]
    return found


@pytest.mark.parametrize("directory", MODELS, ids=[p.name for p in MODELS])
def test_an_imported_marian_model_translates_as_marian(directory, tmp_path):
    import_marian_npz(directory, tmp_path / "ckpt")
    model, vocab = load_translator(tmp_path / "ckpt")
    sources = corpus_lines("test", 0, SENTENCES)
    theirs = marian_decode(directory, sources, tmp_path)
    ids = [vocab.encode_source(s) for s in sources]
    config = DecodeConfig(beam=BEAM, alpha=NORMALIZE, rules=SEARCH_RULES["marian"])
    ours = [h[0].tokens for h in decode_ids(model, ids, SearchRequest(config))]
    same = [[vocab.id_to_piece(t) for t in o] == pieces for o, (pieces, _) in zip(ours, theirs)]
    targets = [  # the eos when Marian scored one (an output cut at the length limit has none)
        [vocab.piece_to_id(p) for p in pieces] + [vocab.eos_id] * (len(scores) - len(pieces))
        for pieces, scores in theirs
    ]
    scored = score_ids(model, ids, targets)
    worst = max(
        max(abs(a - b) for a, b in zip(s.token_log_probs, scores, strict=True))
        for s, (_, scores) in zip(scored, theirs)
    )
    print(
        f"{directory.name}: {sum(same)}/{len(same)} outputs equal, max |log-prob diff| {worst:.2e}"
    )
    assert sum(same) == len(same)
    assert worst < 1e-4
