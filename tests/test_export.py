"""Export plumbing that needs neither transformers nor ctranslate2: OUT is never clobbered,
unrepresentable options are named, and the CLI turns both into one line and exit code 2."""

import json
import os

import pytest
import torch

from aiayn import ModelConfig, Transformer
from aiayn.checkpoint import save_checkpoint
from aiayn.cli.main import main
from aiayn.config import to_dict
from aiayn.export import MARKER, ExportError
from aiayn.export.common import deviations, export_dir, refuse_unsupported


def test_writes_to_a_new_directory_with_a_marker(tmp_path):
    with export_dir(tmp_path / "out", {"format": "test"}) as tmp:
        (tmp / "model.bin").write_text("weights")
        assert not (tmp_path / "out").exists()  # nothing at OUT until the rename
    assert (tmp_path / "out" / "model.bin").read_text() == "weights"
    assert json.loads((tmp_path / "out" / MARKER).read_text()) == {"format": "test"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary left behind


def test_replaces_a_previous_export_and_an_empty_directory(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for content in ("first", "second"):
        with export_dir(out, {"format": "test"}) as tmp:
            (tmp / content).write_text(content)
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "second"]


@pytest.mark.parametrize("existing", ["foreign_dir", "file"])
def test_refuses_to_overwrite_what_it_did_not_create(tmp_path, existing):
    out = tmp_path / "out"
    if existing == "file":
        out.write_text("notes")
    else:
        out.mkdir()
        (out / "notes.txt").write_text("notes")
    with pytest.raises(ExportError, match="not overwriting"):
        with export_dir(out, {"format": "test"}):
            pytest.fail("the export must be refused before any work")
    assert (out.read_text() if existing == "file" else (out / "notes.txt").read_text()) == "notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_failed_export_leaves_the_previous_one(tmp_path):
    out = tmp_path / "out"
    with export_dir(out, {"format": "test"}) as tmp:
        (tmp / "old").write_text("old")
    with pytest.raises(RuntimeError):
        with export_dir(out, {"format": "test"}) as tmp:
            (tmp / "half").write_text("half")
            raise RuntimeError("crash while converting")
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "old"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_every_deviation_is_named():
    cfg = ModelConfig.preset(
        "tiny",
        norm="pre",
        positional="learned",
        scale_attention=False,
        attention_window=3,
        d_k=4,
        d_v=4,
    )
    assert sorted(deviations(cfg)) == [
        "attention_window",
        "d_k",
        "norm",
        "positional",
        "scale_attention",
    ]
    assert deviations(ModelConfig.preset("tiny")) == {}
    with pytest.raises(
        ExportError,
        match=r"X cannot represent this model: scale_attention=False.*; attention_window=3",
    ):
        refuse_unsupported(cfg, "X", supported={"norm", "positional", "d_k"})


def test_cli_refuses_a_foreign_out_in_one_line(tmp_path, capsys):
    model = Transformer(ModelConfig.preset("tiny"))
    ckpt = save_checkpoint(
        tmp_path / "ckpts", 1, model, {"model_config": to_dict(model.cfg)}, None, None
    )
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep me")
    with pytest.raises(SystemExit) as exit_info:
        main(["export", "--checkpoint", str(ckpt), "--to", "hf", "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and err[0].startswith("aiayn export: error: --out")
        and "not an aiayn export" in err[0]
    )
    assert (tmp_path / "out" / "mine.txt").read_text() == "keep me"


def test_cli_needs_the_checkpoint_vocabulary(tmp_path, capsys):
    model = Transformer(ModelConfig.preset("tiny"))
    ckpt = save_checkpoint(
        tmp_path / "ckpts", 1, model, {"model_config": to_dict(model.cfg)}, None, None
    )
    with pytest.raises(SystemExit):
        main(
            [
                "export",
                "--checkpoint",
                str(ckpt),
                "--to",
                "ctranslate2",
                "--out",
                str(tmp_path / "out"),
            ]
        )
    assert "no spm.model" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("mode", [None, "int8"])
def test_a_model_converted_for_decoding_is_refused(mode):
    """Packing or int8 replaces the nn.Linear weights the exporters read: a clear error, not an AttributeError."""
    from aiayn.decode import for_decoding
    from aiayn.export.common import refuse_decoding_form

    model = Transformer(ModelConfig.preset("tiny")).eval()
    refuse_decoding_form(model)  # as trained: accepted
    converted = for_decoding(model, mode)
    if mode is None and all(
        type(m) is torch.nn.Linear for m in converted.modules() if hasattr(m, "in_features")
    ):
        pytest.skip(
            "this PyTorch has no oneDNN: for_decoding(model) leaves the Linear layers as they are"
        )
    with pytest.raises(ExportError, match="packed or quantized for decoding"):
        refuse_decoding_form(converted)
    pytest.importorskip("transformers")
    from aiayn.export.hf import to_marian

    with pytest.raises(ExportError, match="packed or quantized for decoding"):
        to_marian(converted)  # the exporter itself refuses, before reading any weight


def test_cli_names_an_out_below_a_file_in_one_line(tmp_path, capsys):
    model = Transformer(ModelConfig.preset("tiny"))
    ckpt = save_checkpoint(
        tmp_path / "ckpts", 1, model, {"model_config": to_dict(model.cfg)}, None, None
    )
    (tmp_path / "afile").write_text("keep me")
    out = tmp_path / "afile" / "sub"
    with pytest.raises(SystemExit) as exit_info:
        main(["export", "--checkpoint", str(ckpt), "--to", "hf", "--out", str(out)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"aiayn export: error: cannot write {out}: {tmp_path / 'afile'} is a file, not a directory"
    ]
    assert (tmp_path / "afile").read_text() == "keep me"


def test_an_export_gets_the_usual_permissions(tmp_path):
    from safetensors.torch import save_file  # writes 0600 files of its own accord

    old = os.umask(0o022)
    try:
        with export_dir(tmp_path / "out", {"format": "test"}) as tmp:
            save_file({"w": torch.zeros(2)}, str(tmp / "model.safetensors"))
    finally:
        os.umask(old)
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o755
    for name in ("model.safetensors", MARKER):
        assert (tmp_path / "out" / name).stat().st_mode & 0o777 == 0o644, name
