"""WMT loaders on local fixtures in the real formats (no network, no `datasets`)."""

import pytest

from aiayn.data import read_parallel
from aiayn.data.wmt import read_sgm, sgm_pairs, write_hf_split
from aiayn.errors import UserError

SGM_SRC = """<srcset setid="newstest2014" srclang="any">
<doc sysid="ref" docid="1012-bbc" genre="news" origlang="en">
<p>
<seg id="1">Gutach: Increased safety for pedestrians</seg>
<seg id="2"> They are not even 100 metres apart: &amp; more </seg>
</p>
</doc>
</srcset>
"""
SGM_REF = (
    SGM_SRC.replace("srcset", "refset")
    .replace(
        "Gutach: Increased safety for pedestrians", "Gutach: Noch mehr Sicherheit für Fußgänger"
    )
    .replace(
        "They are not even 100 metres apart", "Sie stehen keine 100 Meter voneinander entfernt"
    )
)


def test_read_sgm_keeps_segments_like_sacrebleu(tmp_path):
    (tmp_path / "src.sgm").write_text(SGM_SRC, encoding="utf-8")
    # Entities are kept as written, as sacrebleu does, so references match its BLEU.
    assert read_sgm(tmp_path / "src.sgm") == [
        "Gutach: Increased safety for pedestrians",
        "They are not even 100 metres apart: &amp; more",
    ]


def test_sgm_pairs_align_and_count_mismatch_fails(tmp_path):
    (tmp_path / "src.sgm").write_text(SGM_SRC, encoding="utf-8")
    (tmp_path / "ref.sgm").write_text(SGM_REF, encoding="utf-8")
    pairs = list(sgm_pairs(tmp_path / "src.sgm", tmp_path / "ref.sgm"))
    assert pairs[0] == (
        "Gutach: Increased safety for pedestrians",
        "Gutach: Noch mehr Sicherheit für Fußgänger",
    )
    (tmp_path / "short.sgm").write_text(SGM_REF.replace('<seg id="2">', "<!--"), encoding="utf-8")
    with pytest.raises(UserError, match="segment counts differ: .* has 2, .* has 1"):
        sgm_pairs(tmp_path / "src.sgm", tmp_path / "short.sgm")


def test_hf_rows_become_aligned_files(tmp_path):
    rows = [  # the shape of load_dataset("wmt/wmt14", "de-en")[split] rows
        {
            "translation": {
                "de": "Wiederaufnahme der Sitzungsperiode",
                "en": "Resumption of the session",
            }
        },
        {"translation": {"de": "Zeile\nzwei", "en": "Line two"}},
    ]
    src, tgt, n = write_hf_split(rows, "en", "de", tmp_path, "train")
    assert (src.name, tgt.name, n) == ("train.en", "train.de", 2)
    pairs, _ = read_parallel(src, tgt)
    assert pairs == [
        ("Resumption of the session", "Wiederaufnahme der Sitzungsperiode"),
        ("Line two", "Zeile zwei"),
    ]
