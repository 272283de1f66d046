"""Bad input, as a table: each command, given what people get wrong, ends with one line on
stderr and exit status 2 (no traceback), before any model loads where the input can be read
first; Ctrl-C ends with 130 and says how to resume. The README lists the same table."""

from __future__ import annotations

import json
import shutil

import pytest

import juice.apps.cli as cli

from helpers.bad_input import HEADS, write


def _paper_folder(shared_data, root, mutate=None):
    folder = root / "world_capital"
    shutil.copytree(shared_data / "paraconflict" / "world_capital", folder)
    if mutate:
        mutate(folder)
    return root


def _no_field(folder):
    rows = json.loads((folder / "unfiltered_test.json").read_text())
    del rows[3]["Clean Prompt"]
    (folder / "unfiltered_test.json").write_text(json.dumps(rows))


def _empty_answer(folder):
    rows = json.loads((folder / "unfiltered_test.json").read_text())
    rows[0]["Answer"] = " "
    (folder / "unfiltered_test.json").write_text(json.dumps(rows))


def _contextual_root(tmp, nq_lines):
    root = tmp / "ctx"
    (root / "memotrap").mkdir(parents=True)
    write(root / "nqswap" / "nqswap.jsonl", nq_lines)
    return root


_LISTENING: list = []


def _port_in_use() -> str:
    """A port another socket listens on (kept open for the session)."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    _LISTENING.append(sock)
    return str(sock.getsockname()[1])


# (case, argv builder, expected text in the one line)
CASES = [
    ("serve: a port out of range", lambda tmp, sd: ["serve", "--port", "99999"],
     "Invalid value for '--port': Input should be less than or equal to 65535"),
    ("serve: a port in use", lambda tmp, sd: ["serve", "--port", _port_in_use()], "in use (another server?); pick "
                                                                                   "another --port"),
    ("serve: a host that does not resolve", lambda tmp, sd: ["serve", "--host", "no-such-host.invalid"],
     "'no-such-host.invalid' does not resolve"),
    ("serve --engine vllm: a port in use", lambda tmp, sd: ["serve", "--engine", "vllm", "--port", _port_in_use()],
     "in use"),
    ("reproduce: --data does not exist", lambda tmp, sd: ["reproduce", "--data", str(tmp / "nope")], "does not exist"),
    ("reproduce: --data holds no domain", lambda tmp, sd: ["reproduce", "--data", str(tmp)],
     "holds no ParaConflict domain"),
    ("reproduce: a split file is not JSON", lambda tmp, sd: ["reproduce", "--data", str(_paper_folder(
        sd, tmp / "d", lambda f: (f / "unfiltered_test.json").write_text("[{")))], "not a JSON file"),
    ("reproduce: a row lacks a field", lambda tmp, sd: ["reproduce", "--data", str(_paper_folder(
        sd, tmp / "d", _no_field))], "item 3 has no field 'Clean Prompt'"),
    ("reproduce: an empty answer", lambda tmp, sd: ["reproduce", "--data", str(_paper_folder(
        sd, tmp / "d", _empty_answer))], "non-empty"),
    ("reproduce: an unknown direction", lambda tmp, sd: ["reproduce", "--direction", "sideways"],
     "direction must be parametric or contextual"),
    ("reproduce: --limit is not a number", lambda tmp, sd: ["reproduce", "--limit", "many"], "--limit"),
    ("reproduce contextual: no data there", lambda tmp, sd: ["reproduce", "--direction", "contextual",
                                                             "--data-root", str(tmp)], "no contextual data"),
    ("reproduce contextual: a malformed NQ-Swap line", lambda tmp, sd: [
        "reproduce", "--direction", "contextual", "--data-root",
        str(_contextual_root(tmp, '{"question": "q", "sub_context": "c", "sub_answer": ["a"], "org_answer": ["b"]}\n{oops\n'))],
     "line 2: not JSON"),
    ("identify: --data does not exist", lambda tmp, sd: ["identify", "--data", str(tmp / "nope")], "does not exist"),
    ("identify: contextual without a data file", lambda tmp, sd: ["identify", "--direction", "contextual"],
     "for the contextual direction give --data"),
    ("evaluate --contexts: an unknown context type", lambda tmp, sd: ["evaluate", "--contexts", "gold,golden"],
     "--contexts takes gold, conflicting, irrelevant, distractor, none, not golden"),
    ("evaluate --contexts: no such source", lambda tmp, sd: ["evaluate", "--contexts", "gold", "--data",
                                                             str(tmp / "nope")], "does not exist"),
    ("generate: the heads file does not exist", lambda tmp, sd: ["generate", "x", "--heads", str(tmp / "h.json")],
     "does not exist"),
    ("generate: the heads file is not JSON", lambda tmp, sd: ["generate", "x", "--heads",
                                                              str(write(tmp / "h.json", "{heads"))], "not JSON"),
    ("generate: another file format", lambda tmp, sd: ["generate", "x", "--heads", str(write(tmp / "h.json", "[]"))],
     "not a juice heads file"),
    ("generate: a heads file without its heads", lambda tmp, sd: ["generate", "x", "--heads", str(write(
        tmp / "h.json", json.dumps({k: v for k, v in HEADS.items() if k != "negative_heads"})))],
     "without the field 'negative_heads'"),
    ("generate: an unknown model alias", lambda tmp, sd: ["generate", "x", "--model", "gemma-3-27m", "--heads",
                                                          str(write(tmp / "h.json", json.dumps(HEADS)))],
     "not an embedded alias (gemma-3-270m, smollm2-135m, qwen2.5-coder-1.5b)"),
    ("tune: a row without target", lambda tmp, sd: ["tune", "--heads", str(write(tmp / "h.json", json.dumps(HEADS))),
                                                     "--data", str(write(tmp / "v.jsonl", '{"prompt": "x is"}\n'))],
     "line 1: no target"),
    ("tune: an unknown method", lambda tmp, sd: ["tune", "--heads", str(write(tmp / "h.json", json.dumps(HEADS))),
                                                 "--data", str(write(tmp / "v.jsonl", '{"prompt": "x is", "target": "y"}\n')),
                                                 "--methods", "cad"], "tune chooses settings for ph3, june, juice (and auto)"),
    ("evaluate: juice without a heads file", lambda tmp, sd: [
        "evaluate", "--data", str(write(tmp / "t.jsonl", '{"prompt": "x is", "target": "y"}\n')), "--methods", "juice"],
     "juice needs a heads file"),
    ("evaluate: an unknown method", lambda tmp, sd: [
        "evaluate", "--data", str(write(tmp / "t.jsonl", '{"prompt": "x is", "target": "y"}\n')), "--methods", "cadd"],
     "unknown method 'cadd'"),
    ("toy: an unknown part", lambda tmp, sd: ["toy", "everything", "--out", str(tmp / "toy")], "choose all or one of"),
]


NEEDS_SHARED = {"reproduce: a split file is not JSON", "reproduce: a row lacks a field", "reproduce: an empty answer"}


@pytest.mark.parametrize("name, argv, expected", CASES, ids=[c[0] for c in CASES])
def test_bad_input_ends_in_one_line(name, argv, expected, tmp_path, monkeypatch, capsys):
    from conftest import SHARED

    if name in NEEDS_SHARED and not (SHARED / "data" / "paraconflict").is_dir():
        pytest.skip("needs ../shared/data (the paper's ParaConflict files)")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)   # the unknown alias: no network

    def no_model(*args, **kwargs):
        if "alias" not in name:
            raise AssertionError("the model was loaded before the bad input was found")
        return real_load(*args, **kwargs)

    import juice.pipeline.run
    import juice.models

    real_load = juice.models.load_model
    monkeypatch.setattr(juice.models, "load_model", no_model)
    monkeypatch.setattr(juice.pipeline.run, "load_model", no_model)   # bound at import by the pipelines
    status = cli.main(argv(tmp_path, SHARED / "data"))
    err = capsys.readouterr().err
    assert status == 2, err
    assert expected in err, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len([line for line in lines if line.startswith(("error:", "Error:"))]) == 1


def test_ctrl_c_says_how_to_resume(monkeypatch, capsys):
    def interrupted(**kwargs):
        raise KeyboardInterrupt

    import juice.experiments.table1

    monkeypatch.setattr(juice.experiments.table1, "reproduce", lambda *a, **k: interrupted())
    assert cli.main(["reproduce", "--out", "/tmp/juice-ctrl-c"]) == 130
    assert "run the same command again to resume" in capsys.readouterr().err


def test_debug_shows_the_traceback(monkeypatch, tmp_path):
    monkeypatch.setenv("JUICE_DEBUG", "1")
    with pytest.raises(ValueError, match="not a juice heads file"):
        cli.main(["generate", "x", "--heads", str(write(tmp_path / "h.json", "[]"))])


