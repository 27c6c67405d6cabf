"""Helpers of the CLI tests: run the CLI in-process, check its one-line errors."""

import shutil
import subprocess
import sys
from pathlib import Path

from aiayn.cli.main import main
from aiayn.train import TrainConfig

TINY = {"N_enc": 1, "N_dec": 1, "d_model": 32, "d_ff": 64, "h": 2}


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``aiayn ARGV`` run in this process."""
    try:
        main([str(a) for a in argv])
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str, *needles: str) -> None:
    lines = [line for line in err.splitlines() if line.startswith("aiayn ")]
    assert lines and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[-1], (needle, err)


def config(data: Path, out: Path, **overrides) -> TrainConfig:
    base = dict(
        data=str(data),
        out=str(out),
        preset="tiny",
        model=dict(TINY),
        max_src_tokens=400,
        max_tgt_tokens=400,
        warmup=10,
        max_updates=2,
        save_every_minutes=None,
        validate=False,
        num_threads=1,
        log_every=1,
        amp="none",  # fp32, whatever the CPU: tests of bf16 ask for it
    )
    return TrainConfig(**{**base, **overrides})


def copy_run(tiny_run: Path, dest: Path) -> Path:
    shutil.copytree(tiny_run / "checkpoints", dest)
    return dest


def dead_leftover(dest, *, holding_old_copy: bool = False):
    """What a killed process leaves: a ``temp_dir_beside(dest)`` of a process that has ended
    (with the old copy of ``dest`` inside, as publish_dir's fallback moves it aside)."""
    code = (
        "import sys; from pathlib import Path; from aiayn.files import temp_dir_beside; "
        "tmp = temp_dir_beside(sys.argv[1]); (tmp / 'model').write_text('30 MB'); "
        f"{holding_old_copy} and (tmp / Path(sys.argv[1]).name).mkdir(); print(tmp)"
    )
    result = subprocess.run([sys.executable, "-c", code, str(dest)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return Path(result.stdout.strip())
