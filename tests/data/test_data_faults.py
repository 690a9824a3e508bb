"""Damaged data files: a tokenizer file that does not parse, a .jsonl line that does not, read by text_files and
by the Hugging Face json builder. Each is one line naming the file (and the line), and saying what to do."""

from __future__ import annotations

import pytest

from lmzoo.data.hf import hf_documents
from lmzoo.data.text_files import _jsonl_documents
from lmzoo.data.tokenizers import HFTokenizer, bpe_cache_path, bpe_tokenizer
from lmzoo.faults import EXIT_CONFIG

from conftest import TINY, run_lmzoo

pytest.importorskip("tokenizers")

BAD_LINE = '{"text": "one fine document"}\n{"text": "a control \x01 character"}\n'


def test_a_bad_jsonl_line_names_the_file_and_the_line(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text(BAD_LINE)
    with pytest.raises(ValueError, match=rf"^{path}:2: not a JSON line \(JSONDecodeError: Invalid control character"):
        _jsonl_documents(str(path), "text")


def test_a_bad_jsonl_file_read_by_the_json_builder_is_one_line(tmp_path, capsys):
    pytest.importorskip("datasets")
    path = tmp_path / "docs.jsonl"
    path.write_text(BAD_LINE + '{"text": broken\n')
    with pytest.raises(ValueError) as error:
        hf_documents("json", data_files=[str(path)])
    message = str(error.value)
    assert message.startswith(f"data.hf_data_files=['{path}'] could not be read by the 'json' builder (")
    assert "\n" not in message and message.endswith("; fix that file")
    assert capsys.readouterr().err == ""  # no error logged by the library, no progress bar


def test_the_json_builder_names_the_bad_line_counted_from_one(tmp_path):
    pytest.importorskip("datasets")
    path = tmp_path / "docs.jsonl"
    lines = [f'{{"text": "document {i} {"word " * 20}"}}' for i in range(1, 21)]
    lines[17] = '{"text": "cut short'  # line 18 (the builder's own message says "row 17")
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"\({path}, line 18: JSONDecodeError: Unterminated string"):
        hf_documents("json", data_files=[str(path)])


def test_a_corrupt_cached_tokenizer_says_to_delete_its_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("LMZOO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    fingerprint = {"sha256": "abc"}
    cached = bpe_cache_path(fingerprint, 300)
    cached.parent.mkdir(parents=True)
    cached.write_text('{"model": {"vocab": ')  # a write cut short
    with pytest.raises(ValueError) as error:
        bpe_tokenizer([b"some text"], 300, fingerprint)
    assert str(error.value).startswith(f"tokenizer file {cached} cannot be read (")
    assert str(error.value).endswith(f"delete its cache folder {cached.parent} and it is trained again")


@pytest.mark.slow  # starts the training command
def test_a_run_with_a_garbage_tokenizer_file_is_one_line(tmp_path):
    garbage = tmp_path / "garbage.json"
    garbage.write_bytes(b"\x00\xff not json")
    with pytest.raises(ValueError, match="point data.tokenizer at an intact tokenizer.json"):
        HFTokenizer(str(garbage))
    proc = run_lmzoo("-m", "lmzoo.train", "+attn=softmax", *TINY, f"data.tokenizer={garbage}",
                     f"run_dir={tmp_path / 'run'}")
    err = proc.stderr.strip()
    assert proc.returncode == EXIT_CONFIG and len(err.splitlines()) == 1, err[-3000:]
    assert f"tokenizer file {garbage} cannot be read" in err
