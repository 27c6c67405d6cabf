"""``aiayn translate``: what it says about its input goes to stderr as one line naming the
input file and the line in it."""

import re
import warnings

from _safety import run_cli

from aiayn.checkpoint import latest_checkpoint


def test_an_overlong_line_is_reported_by_its_line_in_the_file(tiny_run, tmp_path, capsys):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")  # the tiny model: 256 positions
    src = tmp_path / "in.txt"
    lines = ["In the beginning"] * 6
    lines[4] = " ".join(["and the earth"] * 120)  # line 5, the second of the third chunk of 2
    src.write_text("\n".join(lines) + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, out, err = run_cli(
            capsys, "translate", "--checkpoint", ckpt, "--beam", 1, "--chunk", 2, "--input", src
        )
    assert code == 0 and len(out.splitlines()) == 6
    assert not [w for w in caught if "truncated" in str(w.message)]  # no Python warning
    said = [line for line in err.splitlines() if "truncated" in line]
    assert len(said) == 1 and "Warning" not in err, err
    assert re.fullmatch(
        rf"aiayn translate: warning: {re.escape(str(src))}: line 5: \d+ tokens, more than the "
        r"model's 256 positions: truncated",
        said[0],
    ), said
