"""Results as records: one JSON file a measurement, checked on load, rendered into the tables.

The lint at the end renders README.md and docs/ from the committed ``records/`` in memory and
fails when a committed table differs: a figure changed by hand, or a record added without
``python -m aiayn.records render``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from aiayn import records
from aiayn.errors import UserError

ROOT = Path(__file__).resolve().parent.parent


def a_record(**changes) -> records.Record:
    base = records.Record(
        topic="demo",
        what="aiayn demo",
        figures={"SacreBLEU": 22.59, "updates": 2186},
        command="make demo",
        commit="7874d75",
        date="2026-12-01T09:38:00+00:00",
        machine_class="cpu-no_bf16",
        cpu="AMD EPYC",
        flags="avx2",
        threads=2,
        torch="2.13.0",
    )
    return replace(base, **changes)


def test_a_written_record_loads_back_equal_under_a_name_of_its_own(tmp_path):
    record = a_record()
    first = records.write_record(record, tmp_path)
    second = records.write_record(record, tmp_path)
    assert first != second and first.name.startswith("demo-2026-12-01T093800-")
    assert records.load_records(tmp_path) == [record, record]
    assert not [p for p in tmp_path.iterdir() if p.suffix != ".json"], "no temporary file left"


def test_records_load_oldest_first_whatever_their_file_names(tmp_path):
    late = a_record(date="2026-12-03")
    early = a_record(date="2026-11-29T10:00:00")
    (tmp_path / "a.json").write_text(json.dumps(asdict(late)))
    (tmp_path / "b.json").write_text(json.dumps(asdict(early)))
    assert records.load_records(tmp_path) == [early, late]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"topic": "speed"}, "topic 'speed' is not one of"),
        ({"machine_class": "cpu-avx2"}, "machine_class 'cpu-avx2' is not one of"),
        ({"threads": "2"}, "threads must be int"),
        ({"threads": True}, "threads must be int"),
        ({"threads": 0}, "threads must be at least 1"),
        ({"date": "Dec 1"}, "date 'Dec 1' is not ISO 8601"),
        ({"figures": {}}, "figures is empty"),
        ({"figures": {"BLEU": [1]}}, "figures['BLEU'] must be a number or a string"),
        ({"peers": {"fairseq": 0.12}}, "peers['fairseq'] must be a version string"),
        ({"speed": 1}, "unknown key 'speed'"),
    ],
)
def test_a_bad_record_is_one_line_naming_the_file_and_the_key(tmp_path, change, message):
    data = {**asdict(a_record()), **change}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match="bad.json: ") as caught:
        records.load_records(tmp_path)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_missing_key_and_broken_json_name_the_file(tmp_path):
    data = asdict(a_record())
    del data["commit"]
    (tmp_path / "a.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match=r"a.json: missing key 'commit'"):
        records.load_records(tmp_path)
    (tmp_path / "a.json").write_text('{"topic": ')
    with pytest.raises(UserError, match=r"a.json:1: not JSON"):
        records.load_records(tmp_path)


@pytest.mark.parametrize("figure", ["NaN", "Infinity", "-Infinity"])
def test_a_figure_that_is_no_number_is_named_not_rendered(tmp_path, capsys, figure):
    """json reads NaN and Infinity: a table showing 'nan' (and --check calling the page out of
    date) would hide a measurement that failed."""
    (tmp_path / "records").mkdir()
    text = json.dumps(asdict(a_record())).replace("22.59", figure)
    (tmp_path / "records" / "a.json").write_text(text)
    assert records.main(["render", "--root", str(tmp_path), "--check"]) == 2
    err = capsys.readouterr().err
    assert "a.json: figures['SacreBLEU'] is " in err and "not a measured number" in err


def test_a_record_that_is_not_utf8_is_one_line(tmp_path, capsys):
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "a.json").write_bytes(b'{"topic": "\xff"}')
    assert records.main(["render", "--root", str(tmp_path), "--check"]) == 2
    err = capsys.readouterr().err
    assert "a.json: not UTF-8 text (byte 11)" in err and err.count("\n") == 1


def test_a_bad_record_is_refused_before_a_file_is_written(tmp_path):
    with pytest.raises(UserError, match="topic"):
        records.write_record(a_record(topic="nope"), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_make_record_fills_in_the_commit_date_machine_and_versions(tmp_path):
    record = records.make_record(
        topic="decoding", what="x", figures={"s": 1.5}, command="aiayn evaluate", threads=1
    )
    model, flags = records.cpu_model_and_flags()
    assert record.cpu == model and record.machine_class == records.cpu_class(flags)
    assert record.threads == 1 and record.torch == records.package_version("torch") != "none"
    assert record.commit == "unknown" or record.commit.rstrip("+").isalnum()
    assert record.date.endswith("+00:00")


@pytest.mark.parametrize(
    ("flags", "cls"),
    [
        ({"avx2"}, "cpu-no_bf16"),
        ({"avx2", "avx512_bf16"}, "cpu-avx512_bf16"),
        ({"avx2", "avx512_bf16", "amx_bf16"}, "cpu-amx"),
    ],
)
def test_the_cpu_class_follows_the_flags_as_aiayn_hardware_names_it(flags, cls):
    assert records.cpu_class(flags) == cls


def test_a_table_shows_the_newest_record_of_each_thing_on_each_class():
    old = a_record(figures={"SacreBLEU": 17.17}, date="2026-11-30")
    new = a_record(figures={"SacreBLEU": 22.59}, date="2026-12-01")
    other = a_record(figures={"SacreBLEU": 30.15}, machine_class="cpu-amx", date="2026-11-01")
    table = records.render_topic([old, other, new], "demo")
    assert "**22.59**" in table and "**30.15**" in table and "17.17" not in table
    assert table.index("22.59") < table.index("30.15"), "newest first"


def test_the_headline_table_holds_headline_records_in_topic_order_and_names_machines_once():
    demo = a_record(headline=True)
    speed = a_record(topic="training", what="step", figures={"x": "1.18x"}, headline=True)
    hidden = a_record(topic="serving", what="serve", figures={"x": 3.49})
    table = records.render_headline([speed, hidden, demo])
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row.split(" | ")[0] for row in rows[1:]] == ["| aiayn demo", "| step"]
    assert "[demo](docs/demo.md#measured)" in rows[1]
    assert table.count("AMD EPYC") == 1, "the machine is named once, under the table"


def test_render_replaces_only_the_marked_blocks(tmp_path):
    text = "intro\n<!-- results:demo -->\nstale\n<!-- /results -->\noutro\n"
    out = records.render_text(text, [a_record()], "page.md")
    assert out.startswith("intro\n<!-- results:demo -->\n| what |")
    assert out.endswith("<!-- /results -->\noutro\n") and "stale" not in out
    assert records.render_text(out, [a_record()], "page.md") == out, "a render is stable"


def test_a_block_naming_no_topic_is_one_line_naming_the_page():
    with pytest.raises(UserError, match=r"page.md: results:speed names no topic"):
        records.render_text("<!-- results:speed -->\n<!-- /results -->", [], "page.md")


def test_the_render_command_rewrites_pages_and_check_reports_them(tmp_path, capsys):
    (tmp_path / "records").mkdir()
    records.write_record(a_record(headline=True), tmp_path / "records")
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "demo.md"
    page.write_text("# Demo\n<!-- results:demo -->\n<!-- /results -->\n")
    (tmp_path / "README.md").write_text("<!-- results:headline -->\n<!-- /results -->\n")
    assert records.main(["render", "--root", str(tmp_path), "--check"]) == 1
    assert "**22.59**" not in page.read_text(), "--check writes nothing"
    assert records.main(["render", "--root", str(tmp_path)]) == 0
    assert "**22.59**" in page.read_text() and "**22.59**" in (tmp_path / "README.md").read_text()
    assert records.main(["render", "--root", str(tmp_path), "--check"]) == 0
    assert "out of date: docs/demo.md" in capsys.readouterr().out


@pytest.mark.lint
def test_the_committed_tables_are_a_fresh_render_of_the_committed_records():
    stale = records.render(ROOT, write=False)
    names = [str(p.relative_to(ROOT)) for p in stale]
    assert not stale, f"run `python -m aiayn.records render`: out of date: {', '.join(names)}"


@pytest.mark.lint
def test_every_committed_record_loads():
    assert records.load_records(ROOT / "records"), "records/ holds the measurements"


@pytest.mark.lint
def test_each_recorded_topic_has_its_table_where_the_readme_links_to_it():
    from test_docs import anchors

    topics = {record.topic for record in records.load_records(ROOT / "records")}
    for topic in sorted(topics):
        page, _, anchor = records.PAGES[topic].partition("#")
        text = (ROOT / page).read_text(encoding="utf-8")
        assert f"<!-- results:{topic} -->" in text, f"{page} has no table of {topic}'s records"
        assert anchor in anchors(ROOT / page), f"{page} has no heading #{anchor}"
