"""Tests for lmzoo.data: sources, splits, tokenizers, windows and batches.

Everything runs on small files written to tmp_path, plus the local Python
standard library; nothing is downloaded.
"""

import json
import re

import numpy as np
import pytest

from lmzoo.data import build_data, build_tokenizer
from lmzoo.data import corpus, stdlib, text_files
from lmzoo.data.token_windows import TokenWindows, token_stream
from lmzoo.data.train_iterators import train_iterator
from lmzoo.data.validation_spans import ValidationWindows, scored_targets, spread_spans
from lmzoo.data.hf import HFConfig
from lmzoo.data.text_files import TextFilesConfig
from lmzoo.data.tokenizers import ByteTokenizer, HFTokenizer

# --- helpers ------------------------------------------------------------------


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def write_jsonl(path, texts, field="text"):
    return write(path, "".join(json.dumps({field: text, "id": i}) + "\n" for i, text in enumerate(texts)))


def numbered_files(folder, count):
    """Files whose content names them, so a document identifies its file."""
    return {f"f{i:02d}.txt": write(folder / f"f{i:02d}.txt", f"file {i:02d}\n") for i in range(count)}


def text_config(paths, **overrides):
    return TextFilesConfig(paths=paths, **overrides)


def arange_stream(n_tokens):
    """A token stream whose values are their own positions: easy to check windows."""
    return np.arange(n_tokens, dtype=np.int32)


def take(iterator, count):
    return [next(iterator) for _ in range(count)]


def assert_batches_equal(first, second):
    assert len(first) == len(second)
    for a, b in zip(first, second):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


# --- splitting ----------------------------------------------------------------


def test_stable_fraction_is_pinned_sha256_not_python_hash():
    # A change here would silently move files between train and validation.
    assert corpus.stable_fraction("a") == pytest.approx(0.7913742705223816, abs=1e-15)
    assert 0.0 <= corpus.stable_fraction("dir/file.py") < 1.0


def test_split_by_file_follows_hash_rule_and_ignores_cwd(tmp_path, monkeypatch):
    numbered_files(tmp_path / "corpus", 40)
    docs = text_files.text_file_documents(str(tmp_path / "corpus" / "*.txt"), val_fraction=0.25)
    expected_val = {f"file {i:02d}\n".encode() for i in range(40) if corpus.stable_fraction(f"f{i:02d}.txt") < 0.25}
    assert 0 < len(expected_val) < 40  # the rule itself leaves both sides non-empty here
    assert set(docs.validation) == expected_val
    assert set(docs.train).isdisjoint(docs.validation)
    assert len(docs.train) + len(docs.validation) == 40
    assert docs.fingerprint["split_by"] == "files"

    monkeypatch.chdir(tmp_path / "corpus")
    again = text_files.text_file_documents("*.txt", val_fraction=0.25)
    assert again.validation == docs.validation and again.train == docs.train
    assert again.fingerprint["sha256"] == docs.fingerprint["sha256"]


def test_validation_is_never_empty_with_few_files(tmp_path):
    numbered_files(tmp_path, 2)
    docs = text_files.text_file_documents(str(tmp_path / "*.txt"), val_fraction=0.0)
    assert len(docs.train) == 1 and len(docs.validation) == 1


def test_single_jsonl_file_is_split_by_line(tmp_path):
    texts = [f"line {i}" for i in range(20)]
    path = write_jsonl(tmp_path / "one.jsonl", texts)
    docs = text_files.text_file_documents(str(path), val_fraction=0.2)
    assert docs.fingerprint["split_by"] == "documents"
    assert docs.validation and docs.train
    assert sorted(docs.train + docs.validation) == sorted(t.encode() for t in texts)


def test_single_text_document_is_split_at_a_line_break(tmp_path):
    lines = [f"line {i}\n" for i in range(100)]
    path = write(tmp_path / "book.txt", "".join(lines))
    docs = text_files.text_file_documents(str(path), val_fraction=0.1)
    (head,), (tail,) = docs.train, docs.validation
    assert head + tail == "".join(lines).encode()
    assert head.endswith(b"\n") and tail.startswith(b"line ")
    assert 0.05 < len(tail) / (len(head) + len(tail)) < 0.15


def test_no_documents_is_an_error(tmp_path):
    write(tmp_path / "empty.jsonl", "\n")
    with pytest.raises(ValueError, match="no documents"):
        text_files.text_file_documents(str(tmp_path / "empty.jsonl"))


# --- stdlib -------------------------------------------------------------------


def test_stdlib_skips_tests_and_third_party_packages(tmp_path):
    for relpath in ["a.py", "pkg/b.py", "pkg/notes.txt", "test/t.py", "pkg/tests/t.py",
                    "idlelib/idle_test/t.py", "site-packages/x/x.py", "dist-packages/y.py"]:
        write(tmp_path / relpath, f"# {relpath}\n")
    docs = stdlib.stdlib_documents(root=str(tmp_path))
    assert sorted(docs.train + docs.validation) == [b"# a.py\n", b"# pkg/b.py\n"]
    assert docs.fingerprint["files"] == 2


def test_stdlib_fingerprint_is_deterministic():
    first = stdlib.stdlib_documents()
    second = stdlib.stdlib_documents()
    fingerprint = first.fingerprint
    assert fingerprint == second.fingerprint
    assert first.validation == second.validation
    assert fingerprint["source"] == "stdlib"
    assert fingerprint["files"] > 100
    assert fingerprint["train_files"] + fingerprint["val_files"] == fingerprint["files"]
    assert 0.01 < fingerprint["val_files"] / fingerprint["files"] < 0.15
    assert fingerprint["bytes"] == sum(map(len, first.train + first.validation))
    json.dumps(fingerprint)


# --- text_files and hf sources ------------------------------------------------


def test_text_files_read_txt_and_jsonl(tmp_path):
    write(tmp_path / "a.txt", "alpha")
    write(tmp_path / "b.txt", "beta")
    write_jsonl(tmp_path / "sub" / "c.jsonl", ["gamma", "delta", "epsilon"], field="body")
    patterns = [str(tmp_path / "*.txt"), str(tmp_path / "**" / "*.jsonl")]
    docs = text_files.text_file_documents(patterns, text_field="body")
    assert sorted(docs.train + docs.validation) == sorted([b"alpha", b"beta", b"gamma", b"delta", b"epsilon"])
    assert docs.fingerprint["files"] == 3 and docs.fingerprint["documents"] == 5
    with pytest.raises(ValueError, match="'text'"):
        text_files.text_file_documents(patterns)  # the default field is absent


@pytest.fixture
def offline_hf(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")


def test_hf_source_on_local_jsonl_splits_rows_by_hash(tmp_path, offline_hf):
    texts = [f"row {i}" for i in range(30)]
    path = write_jsonl(tmp_path / "rows.jsonl", texts)
    cfg = HFConfig(hf_name="json", hf_data_files=str(path), val_fraction=0.3)
    docs = cfg.documents()
    expected_val = [t.encode() for i, t in enumerate(texts) if corpus.stable_fraction(f"row:{i}") < 0.3]
    assert 0 < len(expected_val) < 30
    assert docs.validation == expected_val
    assert sorted(docs.train + docs.validation) == sorted(t.encode() for t in texts)
    assert docs.fingerprint["rows"] == 30


def test_hf_source_with_named_validation_split(tmp_path, offline_hf):
    train = write_jsonl(tmp_path / "train.jsonl", ["t0", "t1", "t2"])
    val = write_jsonl(tmp_path / "val.jsonl", ["v0"])
    cfg = HFConfig(
        hf_name="json",
        hf_data_files={"train": str(train), "validation": str(val)},
        hf_val_split="validation",
    )
    docs = cfg.documents()
    assert docs.train == [b"t0", b"t1", b"t2"] and docs.validation == [b"v0"]


def write_parquet(path, texts):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": texts, "id": list(range(len(texts)))}), path)
    return path


def named_corpus(name, *overrides):
    """``data=<name>`` (configs/data/<name>.yaml) as the command line composes it, pointed at local files."""
    from conftest import tiny_config

    return tiny_config("softmax", f"data={name}", *overrides).data


def test_fineweb_edu_streams_its_first_rows_and_hash_splits_them(tmp_path, offline_hf):
    texts = [f"document {i}" for i in range(40)]
    path = write_parquet(tmp_path / "sample.parquet", texts)
    cfg = named_corpus("fineweb_edu", "data.hf_name=parquet", "data.hf_config=null", f"data.hf_data_files={path}",
                       "data.hf_max_rows=25", "data.val_fraction=0.2")
    assert (cfg.hf_streaming, cfg.tokenizer, cfg.text_field) == (True, "bpe", "text")
    docs = cfg.documents()
    kept = [t.encode() for t in texts[:25]]
    assert sorted(docs.train + docs.validation) == sorted(kept)
    assert docs.validation == [t for i, t in enumerate(kept) if corpus.stable_fraction(f"row:{i}") < 0.2]
    assert docs.fingerprint["max_rows"] == 25 and docs.fingerprint["rows"] == 25
    whole = HFConfig(hf_name="parquet", hf_data_files=str(path), hf_max_rows=25, val_fraction=0.2).documents()
    assert whole == docs  # streamed or loaded whole: the same documents


def test_tinystories_reads_its_own_validation_split(tmp_path, offline_hf):
    train = write_jsonl(tmp_path / "train.jsonl", ["Once upon a time.", "The end.", "A cat sat."])
    val = write_jsonl(tmp_path / "validation.jsonl", ["A dog ran."])
    cfg = named_corpus("tinystories", "data.hf_name=json", f"data.hf_data_files={{train: {train}, validation: {val}}}")
    assert (cfg.hf_streaming, cfg.hf_val_split, cfg.tokenizer) == (True, "validation", "bpe")
    docs = cfg.documents()
    assert docs.train == [b"Once upon a time.", b"The end.", b"A cat sat."] and docs.validation == [b"A dog ran."]


# --- errors -------------------------------------------------------------------


def test_missing_paths_raise_file_not_found(tmp_path):
    missing = str(tmp_path / "nope.txt")
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        text_files.text_file_documents(missing)
    with pytest.raises(FileNotFoundError, match=r"\*\.jsonl"):
        text_files.text_file_documents(str(tmp_path / "**" / "*.jsonl"))
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        build_tokenizer(missing)


def test_unknown_source_lists_the_registered_ones():
    from lmzoo.config import ConfigError, data_spec
    from lmzoo.registry import SOURCES

    names = SOURCES.names()  # every module of lmzoo.data imported: the built-in sources are all there
    assert {"hf", "mad", "mix", "mqar", "parity", "stdlib", "text_files", "tfds"} <= set(names)
    registered = ", ".join(sorted(names))
    message = f"data.source='parquet' is not a registered data source (registered: {registered})"
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        data_spec("parquet")


def test_each_source_checks_its_own_settings(tmp_path):
    from lmzoo.config import ConfigError

    write(tmp_path / "a.txt", "text\n")
    TextFilesConfig(paths=str(tmp_path / "*.txt")).check()
    for cfg, message in [
        (TextFilesConfig(), "data.paths must be set"),
        (TextFilesConfig(paths=str(tmp_path / "*.md")), "data.paths: no file matches"),
        (TextFilesConfig(paths=str(tmp_path / "*.txt"), val_fraction=1.0), "data.val_fraction=1.0 must lie strictly"),
        (HFConfig(), "data.hf_name must be set"),
        (HFConfig(hf_name="json", hf_data_files=str(tmp_path / "*.jsonl")), "data.hf_data_files: no file matches"),
        (HFConfig(hf_name="json", tokenizer=str(tmp_path / "no.json")), "data.tokenizer="),
        (TextFilesConfig(paths=str(tmp_path / "*.txt"), document_boundaries="cut"),
         "data.document_boundaries='cut' is not valid"),
    ]:
        with pytest.raises(ConfigError, match=f"^{message}"):
            cfg.check()


# --- tokenizers ---------------------------------------------------------------


def test_byte_tokenizer_round_trip_and_specials():
    tokenizer = build_tokenizer("byte")
    ids = tokenizer.encode("héllo")
    assert ids.dtype == np.int32
    assert ids.tolist() == list("héllo".encode("utf-8"))
    with_specials = np.concatenate([[tokenizer.bos_id], ids, [tokenizer.eos_id, tokenizer.pad_id]])
    assert tokenizer.decode(with_specials) == "héllo"
    assert tokenizer.decode([0xFF]) == "\ufffd"
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id, tokenizer.vocab_size) == (256, 257, 258, 259)


def train_bpe_tokenizer(path, special_tokens):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ["the quick brown fox", "jumps over the lazy dog", "the end of the text"] * 10
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.save(str(path))
    return str(path)


def test_hf_tokenizer_round_trip(tmp_path):
    path = train_bpe_tokenizer(tmp_path / "tokenizer.json", ["<pad>", "<s>", "</s>"])
    tokenizer = build_tokenizer(path)
    assert isinstance(tokenizer, HFTokenizer)
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2)
    text = "the lazy fox — jumps!"
    ids = tokenizer.encode(text)
    assert ids.dtype == np.int32 and tokenizer.eos_id not in ids
    assert len(ids) < len(text.encode())  # merges were learned
    assert tokenizer.decode(np.concatenate([ids, [tokenizer.eos_id]])) == text
    np.testing.assert_array_equal(tokenizer.encode_batch([text.encode()])[0], ids)


def test_hf_tokenizer_without_eos_is_rejected(tmp_path):
    path = train_bpe_tokenizer(tmp_path / "no_eos.json", ["<pad>"])
    with pytest.raises(ValueError, match="no_eos.json.*</s>"):
        build_tokenizer(path)


def test_build_data_with_hf_tokenizer(tmp_path):
    path = train_bpe_tokenizer(tmp_path / "tokenizer.json", ["<pad>", "<s>", "</s>"])
    for i in range(6):
        write(tmp_path / "docs" / f"{i}.txt", "the quick brown fox jumps over the lazy dog " * 5)
    data = build_data(text_config(str(tmp_path / "docs" / "*.txt"), tokenizer=path, seq_len=8), seed=0)
    assert data.fingerprint["tokenizer"].startswith("hf:tokenizer.json@")
    assert data.bytes_per_token > 1.5
    assert int((data.train_tokens == data.tokenizer.eos_id).sum()) == data.fingerprint["train_documents"]


# --- token streams and windows ------------------------------------------------


def test_token_stream_ends_every_document_with_eos():
    tokenizer = ByteTokenizer()
    stream = token_stream([b"ab", b"c"], tokenizer)
    assert stream.dtype == np.int32
    assert stream.tolist() == [97, 98, 257, 99, 257]


def test_windows_are_shifted_by_one_and_do_not_overlap():
    windows = TokenWindows(arange_stream(10), seq_len=3)
    assert len(windows) == 3  # tokens 9 is only a target; no partial window
    batch = windows(np.array([0, 2]))
    assert batch["inputs"].tolist() == [[0, 1, 2], [6, 7, 8]]
    assert batch["targets"].tolist() == [[1, 2, 3], [7, 8, 9]]
    assert len(TokenWindows(arange_stream(9), seq_len=3)) == 2


def test_windows_cross_documents_at_eos():
    tokenizer = ByteTokenizer()
    windows = TokenWindows(token_stream([b"ab", b"cd"], tokenizer), seq_len=3)
    batch = windows(np.array([0]))
    assert batch["inputs"].tolist() == [[97, 98, tokenizer.eos_id]]
    assert batch["targets"].tolist() == [[98, tokenizer.eos_id, 99]]


def test_masked_windows_number_the_documents_an_eos_closes():
    tokenizer = ByteTokenizer()
    stream = token_stream([b"ab", b"cde", b"f"], tokenizer)  # a b . c d e . f .
    windows = TokenWindows(stream, seq_len=4, eos_id=tokenizer.eos_id)
    batch = windows(np.array([0, 1]))
    assert batch["inputs"].tolist() == [[97, 98, 257, 99], [100, 101, 257, 102]]
    assert batch["segment_ids"].tolist() == [[0, 0, 0, 1], [0, 0, 0, 1]]  # the EOS stays with its document
    assert "segment_ids" not in TokenWindows(stream, seq_len=4)(np.array([0]))


def test_document_boundaries_mask_reaches_training_and_validation_batches(tmp_path):
    for i in range(6):
        write(tmp_path / f"{i}.txt", "doc\n" * (3 + i))
    masked = build_data(text_config(str(tmp_path / "*.txt"), seq_len=8, document_boundaries="mask"), seed=0)
    batch = next(masked.train_iterator(2))
    assert batch["segment_ids"].shape == batch["inputs"].shape == (2, 8)
    eos = batch["inputs"] == masked.tokenizer.eos_id
    np.testing.assert_array_equal(np.diff(batch["segment_ids"], axis=1), eos[:, :-1])  # a new id after each EOS
    assert "segment_ids" in masked.validation_windows([8], 16)[8](np.arange(1))
    packed = build_data(text_config(str(tmp_path / "*.txt"), seq_len=8), seed=0)
    assert "segment_ids" not in next(packed.train_iterator(2))
    np.testing.assert_array_equal(next(packed.train_iterator(2))["inputs"], batch["inputs"])  # the same windows


def test_bytes_per_token_counts_eos(tmp_path):
    for i in range(10):
        write(tmp_path / f"{i}.txt", "x" * (10 + i))
    data = build_data(text_config(str(tmp_path / "*.txt"), seq_len=4, val_fraction=0.3), seed=0)
    docs = text_files.text_file_documents(str(tmp_path / "*.txt"), val_fraction=0.3)
    val_bytes = sum(map(len, docs.validation))
    assert data.bytes_per_token == pytest.approx(val_bytes / (val_bytes + len(docs.validation)))
    assert 0.9 < data.bytes_per_token < 1.0


# --- training batches ---------------------------------------------------------


def test_train_iterator_is_a_deterministic_epoch_permutation():
    tokens = arange_stream(8 * 16 + 1)  # 16 windows of 8 tokens
    batches = take(train_iterator(tokens, seq_len=8, batch_size=4, seed=1), 4)
    starts = np.concatenate([batch["inputs"][:, 0] for batch in batches])
    assert sorted(starts.tolist()) == list(range(0, 128, 8))  # each window once per epoch
    for batch in batches:
        assert batch["inputs"].shape == (4, 8) and batch["inputs"].dtype == np.int32
        np.testing.assert_array_equal(batch["targets"], batch["inputs"] + 1)
        np.testing.assert_array_equal(batch["inputs"], batch["inputs"][:, :1] + np.arange(8))

    assert_batches_equal(batches, take(train_iterator(tokens, 8, 4, seed=1), 4))
    other = take(train_iterator(tokens, 8, 4, seed=2), 4)
    assert not np.array_equal(starts, np.concatenate([batch["inputs"][:, 0] for batch in other]))


def test_train_iterator_state_resumes_exactly():
    tokens = arange_stream(1000)
    iterator = train_iterator(tokens, seq_len=7, batch_size=5, seed=3)
    take(iterator, 5)
    state = iterator.get_state()
    expected = take(iterator, 3)

    resumed = train_iterator(tokens, seq_len=7, batch_size=5, seed=3)
    resumed.set_state(state)
    assert_batches_equal(take(resumed, 3), expected)


def test_shards_concatenate_to_the_global_batch():
    tokens = arange_stream(2000)
    global_batches = take(train_iterator(tokens, seq_len=10, batch_size=8, seed=0), 3)
    shards = [take(train_iterator(tokens, 10, 8, seed=0, shard_index=i, shard_count=4), 3) for i in range(4)]
    for step, global_batch in enumerate(global_batches):
        for key in ("inputs", "targets"):
            parts = [shards[i][step][key] for i in range(4)]
            assert all(part.shape == (2, 10) for part in parts)
            np.testing.assert_array_equal(np.concatenate(parts), global_batch[key])
    with pytest.raises(ValueError, match="divisible"):
        train_iterator(tokens, 10, 6, seed=0, shard_index=0, shard_count=4)


def test_too_few_windows_for_a_batch_names_the_settings():
    with pytest.raises(ValueError, match=r"data\.seq_len=8.*train\.batch_size=4"):
        train_iterator(arange_stream(20), seq_len=8, batch_size=4, seed=0)


# --- validation windows -------------------------------------------------------


def test_validation_windows_score_the_same_targets_at_every_length():
    tokens = arange_stream(1001)  # one document (no EOS): its spans are the blocks' units
    assert scored_targets(1000, 700, [10, 20, 40]) == 680  # rounded down to whole windows of the longest
    spans = spread_spans(tokens, -1, [10, 20, 40], budget=700)
    assert (spans.length, len(spans.starts), spans.block_unit) == (40, 17, "span")
    scored = (spans.starts[:, None] + 1 + np.arange(40)).ravel()  # stream positions of the scored targets
    assert len(np.unique(scored)) == 680 and scored.max() <= 1000
    for length in (10, 20, 40):
        windows = ValidationWindows(tokens, length, spans)
        batch = windows(np.arange(len(windows)))
        assert batch["inputs"].shape == (680 // length, length)
        np.testing.assert_array_equal(batch["targets"].ravel(), tokens[scored])  # each target once, span by span
        np.testing.assert_array_equal(batch["unit"].ravel(), np.repeat(np.arange(17), 40))
        np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])


def test_validation_budget_defaults_to_the_whole_split_and_must_fill_a_window():
    assert scored_targets(1000, None, [10, 40]) == 1000
    assert scored_targets(1000, 5000, [48, 32]) == 960  # a multiple of both lengths
    with pytest.raises(ValueError, match="fills no window of 1001"):
        scored_targets(1000, None, [1001])


def test_data_object_end_to_end(tmp_path):
    for i in range(20):
        write(tmp_path / f"{i:02d}.txt", f"document number {i} " * 20)
    cfg = text_config(str(tmp_path / "*.txt"), seq_len=16, val_fraction=0.2)
    data = build_data(cfg, seed=0, shard_index=1, shard_count=2)
    json.dumps(data.fingerprint)
    assert data.fingerprint["train_tokens"] == data.train_tokens.size
    assert data.fingerprint["tokenizer"] == "byte"
    batch = next(data.train_iterator(batch_size=4))
    assert batch["inputs"].shape == (2, 16)
    windows = data.validation_windows([16, 32], budget=None)  # whole windows: not split by process
    first = {n: w(np.arange(2)) for n, w in windows.items()}
    assert first[16]["inputs"].shape == (2, 16) and first[32]["inputs"].shape == (2, 32)
    assert len(windows[32]) * 32 == len(windows[16]) * 16 == (data.val_tokens.size - 1) // 32 * 32  # all of it
    assert windows[16].units == windows[32].units == (data.val_tokens == data.tokenizer.eos_id).sum()  # documents
    np.testing.assert_array_equal(first[16]["inputs"][1], data.val_tokens[16:32])


def test_source_specs_are_omegaconf_structured_configs():
    omegaconf = pytest.importorskip("omegaconf")
    text_files, hf = omegaconf.OmegaConf.structured(TextFilesConfig), omegaconf.OmegaConf.structured(HFConfig)
    text_files.paths = ["a/*.txt", "b/**/*.jsonl"]
    hf.hf_data_files = "x.jsonl"
    hf.hf_data_files = {"train": "x.jsonl", "validation": ["y.jsonl"]}
    assert text_files.source == "text_files" and list(text_files.paths) == ["a/*.txt", "b/**/*.jsonl"]
    assert hf.source == "hf" and list(hf.hf_data_files) == ["train", "validation"]
    with pytest.raises(omegaconf.errors.ConfigAttributeError):
        text_files.hf_name = "json"  # each source has only its own settings
