"""benchmarks/demo_vs_fairseq.py without fairseq: the recipe as fairseq flags, the dictionary
that keeps our ids, and the readers of fairseq's logs and outputs."""

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from aiayn.demo import demo_train_config
from aiayn.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "demo_vs_fairseq.py"

spec = importlib.util.spec_from_file_location("demo_vs_fairseq", SCRIPT)
peers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peers)


def _flags(args: list[str]) -> dict[str, str | bool]:
    """``--key value`` / ``--switch`` pairs of an argument list (the positional data dir dropped)."""
    flags: dict[str, str | bool] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else "--"
            flags[arg] = True if nxt.startswith("--") else nxt
    return flags


def test_dictionary_keeps_every_piece_at_our_id():
    ours = ["<pad>", "<unk>", "<s>", "</s>", "▁the", "s", "“", "▁Yahweh"]
    lines = peers.fairseq_dictionary(ours)
    # fairseq numbers <s>, <pad>, </s>, <unk> 0-3 and then the file's entries in order
    fairseq_ids = {line.rsplit(" ", 1)[0]: 4 + k for k, line in enumerate(lines)}
    assert fairseq_ids == {"▁the": 4, "s": 5, "“": 6, "▁Yahweh": 7}
    assert all(line.endswith(" 1") for line in lines)


@pytest.mark.parametrize("bad", ["a b", "", "<pad>"])
def test_dictionary_refuses_a_piece_fairseq_cannot_hold(bad):
    with pytest.raises(UserError, match="piece 5"):
        peers.fairseq_dictionary(["<pad>", "<unk>", "<s>", "</s>", "▁x", bad])


def test_dictionary_of_a_real_vocabulary_has_one_line_per_piece(tiny_corpus):
    from aiayn.data import Vocab

    vocab = Vocab.load(tiny_corpus / "spm.model")
    lines = peers.fairseq_dictionary([vocab.sp.id_to_piece(i) for i in range(len(vocab))])
    assert len(lines) == len(vocab) - 4
    assert len({line.rsplit(" ", 1)[0] for line in lines}) == len(lines)


def test_train_flags_are_the_demo_recipe(tmp_path):
    cfg = demo_train_config(tmp_path, tmp_path / "out", minutes=15)
    model = cfg.model_config(8000)
    flags = _flags(peers.fairseq_train_args(cfg, model, tmp_path / "bin", tmp_path / "ckpt", 190))
    assert float(flags["--lr"]) == pytest.approx(0.5 * 256**-0.5 * 300**-0.5)  # 1.804e-3
    assert float(flags["--lr"]) == pytest.approx(1.8042e-3, abs=1e-7)
    expected = {
        "--encoder-layers": "3",
        "--decoder-layers": "3",
        "--encoder-embed-dim": "256",
        "--encoder-ffn-embed-dim": "1024",
        "--decoder-attention-heads": "4",
        "--dropout": "0.0",
        "--label-smoothing": "0.1",
        "--adam-betas": "(0.9, 0.98)",
        "--adam-eps": "1e-09",
        "--warmup-updates": "300",
        "--warmup-init-lr": "0",
        "--lr-scheduler": "inverse_sqrt",
        "--max-tokens": "1024",
        "--required-batch-size-multiple": "1",
        "--seed": "1",
        "--save-interval-updates": "190",
        "--keep-interval-updates": "3",
        "--num-workers": "0",
    }
    assert {k: flags[k] for k in expected} == expected
    assert float(flags["--stop-time-hours"]) == pytest.approx(0.25)
    assert flags["--share-all-embeddings"] is True and flags["--disable-validation"] is True


def test_train_flags_refuse_what_fairseq_would_train_differently(tmp_path):
    cfg = demo_train_config(tmp_path, tmp_path / "out", minutes=1)
    pre_ln = dataclasses.replace(cfg.model_config(8000), norm="pre")
    with pytest.raises(UserError, match="post-LN"):
        peers.fairseq_train_args(cfg, pre_ln, tmp_path, tmp_path, 1)
    cfg.max_tgt_tokens = 2048
    with pytest.raises(UserError, match="max_src_tokens and max_tgt_tokens"):
        peers.fairseq_train_args(cfg, cfg.model_config(8000), tmp_path, tmp_path, 1)


def test_generate_flags_beam_and_length():
    flags = _flags(peers.fairseq_generate_args(Path("bin"), Path("avg3.pt")))
    assert (flags["--beam"], flags["--lenpen"], flags["--max-len-a"], flags["--max-len-b"]) == (
        "4",
        "0.6",
        "1",
        "50",
    )
    assert flags["--path"] == "avg3.pt" and flags["--gen-subset"] == "test"
    assert flags["--required-batch-size-multiple"] == "1"


def test_save_interval_matches_ours_in_updates(tmp_path):
    cfg = demo_train_config(tmp_path, tmp_path / "out", minutes=15)  # a checkpoint every minute
    assert peers.save_every_updates(cfg, 2864) == 191
    assert peers.save_every_updates(cfg, 3) == 1


def _epoch(epoch: int, updates: int, wpb: float, wall: float) -> str:
    record = {
        "epoch": epoch,
        "train_loss": "5.1",
        "train_wpb": str(wpb),
        "train_num_updates": str(updates),
        "train_train_wall": str(wall),
        "train_wall": str(wall + 3),
    }
    return f"2026-11-30 14:04:11 | INFO | train | {json.dumps(record)}"


def test_train_log_sums_epochs():
    inner = '2026-11-30 | INFO | train_inner | {"epoch": 1, "update": 0.5, "loss": "9", "num_updates": "10"}'
    lines = [
        "INFO | fairseq_cli.train | {'_name': None}",
        inner,
        _epoch(1, 100, 900.0, 40),
        "not json {",
        _epoch(2, 130, 1000.0, 12),
    ]
    assert peers.read_fairseq_train_log(lines) == {
        "updates": 130,
        "target_tokens": 100 * 900.0 + 30 * 1000.0,
        "train_s": 52.0,
    }
    with pytest.raises(UserError, match="no end-of-epoch line"):
        peers.read_fairseq_train_log([inner])


def test_hypotheses_in_test_order():
    lines = [
        "S-1\t▁b",
        "H-1\t-0.5\t▁dos ▁palabras",
        "D-1\t-0.5\tdos palabras",
        "P-1\t-0.1 -0.2",
        "H-0\t-1.2\t▁uno",
        "H-2\t-3.0\t",
    ]
    assert peers.read_fairseq_hypotheses(lines, 3) == [["▁uno"], ["▁dos", "▁palabras"], []]
    with pytest.raises(UserError, match="no hypothesis for 1 of 4 sentences"):
        peers.read_fairseq_hypotheses(lines, 4)


def test_averaged_checkpoints_are_the_last_three_by_update():
    names = [
        "checkpoint_1_99.pt",
        "checkpoint_2_100.pt",
        "checkpoint_1_9.pt",
        "checkpoint_last.pt",
        "checkpoint_2_120.pt",
        "checkpoint_2_110.pt.tmp",
    ]
    assert peers.averaged_inputs(names, 131) == [
        "checkpoint_2_100.pt",
        "checkpoint_2_120.pt",
        "checkpoint_last.pt",
    ]
    # the last update saved as an interval checkpoint too: it is checkpoint_last, not counted twice
    assert peers.averaged_inputs(names, 120) == [
        "checkpoint_1_99.pt",
        "checkpoint_2_100.pt",
        "checkpoint_last.pt",
    ]


def test_table_rows():
    row = {
        "system": "x",
        "updates": 1234,
        "train_s": 30.4,
        "target_tokens_per_s": 1500.2,
        "sacrebleu_last": 1.234,
        "sacrebleu_avg3": 2.0,
    }
    assert peers.format_table([row]).splitlines()[-1] == "| x | 1,234 | 30 | 1,500 | 1.23 | 2.00 |"


def test_out_is_replaced_only_if_this_script_wrote_it(tmp_path):
    peers.check_out(tmp_path / "absent")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "results.json").write_text('{"benchmark": "table3"}')
    with pytest.raises(UserError, match="not written by this script"):
        peers.check_out(foreign)
    (foreign / "results.json").write_text('{"benchmark": "demo_vs_fairseq"}')
    peers.check_out(foreign)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--out", "{mine}"], "{mine} exists and was not written by this script"),
        (["--out", "{new}", "--minutes", "0"], "--minutes must be a positive number"),
        (["--out", "{new}"], "--fairseq-python {python}: cannot run it"),
    ],
)
def test_command_line_errors_are_one_line(tmp_path, monkeypatch, capsys, extra, message):
    names = {"mine": tmp_path / "mine", "new": tmp_path / "new", "python": tmp_path / "no-python"}
    names["mine"].mkdir()
    (names["mine"] / "notes.txt").write_text("keep me")
    argv = ["demo_vs_fairseq.py", "--fairseq-python", str(names["python"])] + [
        a.format(**names) for a in extra
    ]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_:
        peers.main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"demo_vs_fairseq: error: {message.format(**names)}")
        and err.count("\n") == 1
    )
    assert (names["mine"] / "notes.txt").read_text() == "keep me"
    assert not names["new"].exists() and sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
