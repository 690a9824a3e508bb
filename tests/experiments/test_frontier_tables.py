"""The frontier tables generated from a comparison.json: the baseline's row first with no differences, a star only
where Holm's adjustment keeps it, the summary ordered by the difference at T with the baseline where it changes sign."""

import json
import re

import pytest

from lmzoo.config import ConfigError
from lmzoo.experiments import frontier_tables


def interval(estimate, half=0.1, adjusted=None):
    c = {"estimate": estimate, "lo": estimate - half, "hi": estimate + half, "significant": abs(estimate) > half}
    if adjusted is not None:
        c["significant_adjusted"] = adjusted
    return c


def row(label, bpb, params=100):
    return {"label": label, "runs": ["a", "b", "c"], "params": params, "bpb": interval(bpb), "seeds": [0, 1, 2],
            "ratio": {"512": interval(1.0, 0.01), "256": interval(1.0, 0.01)},
            "measurements": {"sparsity": {"mean": 0.3, "sd": 0.01, "n": 3}}}


def difference(label, bpb, adjusted):
    return {"label": label, "bpb": interval(bpb, adjusted=adjusted), "ratio": {"512": interval(-0.05, 0.01, True)},
            "sparsity": interval(0.0, 0.02, False)}


RECORD = {"baseline": "softmax",
          "rows": [row("zeta", 1.7), row("softmax", 2.0), row("alpha", 2.3, params=None), row("mid", 1.85)],
          "differences": [difference("zeta", -0.3, True), difference("alpha", 0.3, False),
                          difference("mid", -0.15, False)]}


def test_the_full_table_puts_the_baseline_first_and_stars_only_adjusted_differences():
    lines = frontier_tables.full_table(RECORD).splitlines()
    assert "bpb@256/bpb@T | bpb@512/bpb@T | − softmax, ratio at 512" in lines[0]
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| `softmax`", "| `alpha`", "| `mid`", "| `zeta`"]
    assert lines[2].split(" | ")[4] == "" and "0.300 ± 0.010" in lines[2]
    assert "+0.300 [+0.200, +0.400] |" in lines[3] and "| — |" in lines[3]  # unstarred; its parameters unknown
    assert "−0.300 [−0.400, −0.200] * |" in lines[5]


def test_the_summary_orders_arms_by_their_difference_and_names_those_the_adjustment_unstars():
    text = frontier_tables.summary_table(RECORD)
    order = [line.split(" | ")[0] for line in text.splitlines()[2:6]]
    assert order == ["| `zeta`", "| `mid`", "| `softmax` (reference)", "| `alpha`"]
    assert "over the 3 arms compared with softmax" in text and "adjustment: `mid`, `alpha`." in text


@pytest.mark.parametrize("content, reason", [(b"{\"rows\": [", "Expecting value"), (b"\xff\xfe", "codec"),
                                             (b"{\"rows\": []}", "no differences, baseline"), (b"[1]", "no rows")])
def test_a_comparison_that_cannot_be_read_is_named_in_one_line(tmp_path, content, reason):
    path = tmp_path / "comparison.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=rf"^report: {re.escape(str(path))} is not a comparison.json file of "
                                          rf"lmzoo.compare \(.*{reason}"):
        frontier_tables.blocks(path)


def test_the_attention_tables_set_each_arm_beside_each_reference_from_that_references_comparison():
    def record(baseline, arms):
        rows = [{**row(label, 2.0), "measurements_by_length": {"sparsity": {"512": {"mean": 0.1, "sd": 0.01, "n": 3}}}}
                for label in arms]
        shift = {"softmax": 0.0, "fox": 0.2, "swa": 0.4}[baseline]
        diffs = [{"label": a, "sparsity": interval(shift + i / 100, 0.01, True),
                  "sparsity_by_length": {"512": interval(-shift, 0.01, False)}, "ratio": {"512": interval(shift)}}
                 for i, a in enumerate(arms) if a != baseline]
        return {"baseline": baseline, "rows": rows, "differences": diffs}

    arms = ["path", "swa", "softmax", "kda", "fox"]  # kda is no attention arm: left out
    text = frontier_tables.attention_tables({b: record(b, arms) for b in frontier_tables.REFERENCES})
    s_table, ratio_table = text.strip().split("\n\n")
    assert s_table.splitlines()[0] == ("| arm | S at T (± sd) | − softmax | − fox | − swa | S at 512 (± sd) "
                                       "| − softmax | − fox | − swa |")
    labels = [line.split(" | ")[0] for line in s_table.splitlines()[2:]]
    assert labels == ["| `softmax`", "| `fox`", "| `swa`", "| `path`"]  # in ATTENTION_ARMS' order
    fox = s_table.splitlines()[3].split(" | ")
    # − softmax from softmax's comparison, blank against itself, − swa from swa's
    assert fox[2] == "+0.040 [+0.030, +0.050] *" and fox[3] == "" and fox[4].startswith("+0.440")
    assert fox[5] == "0.100 ± 0.010" and fox[7] == ""
    assert ratio_table.splitlines()[0] == "| arm | bpb@512/bpb@T | − softmax | − fox | − swa |"
    assert ratio_table.splitlines()[2].split(" | ")[1:3] == ["1.000 [0.990, 1.010]", ""]  # softmax − softmax: blank


def test_the_tasks_table_sets_each_arms_parity_and_mqar_side_by_side(tmp_path):
    assert frontier_tables.tasks_block(tmp_path / "a.json", tmp_path / "b.json").startswith("Not run yet")
    scores = {"control": interval(1.0, 0.0), "train": interval(0.9, 0.05), "test": interval(0.2, 0.1)}
    state = {"name": "state_tracking_papers", "settings": {"train_min": 3, "train_len": 40, "test_min": 40,
                                                           "test_max": 256, "seeds": [0, 1, 2]},
             "evidence": {"columns": {"parity": {"scaled_accuracy": {"softmax": scores, "kda": scores}}}}}
    (tmp_path / "state.json").write_text(json.dumps(state))
    assert "| `kda` | 1.000 [1.000, 1.000] | 0.900 [0.850, 0.950] | 0.200 [0.100, 0.300] |" in (
        frontier_tables.tasks_block(tmp_path / "state.json", tmp_path / "b.json"))
    mqar = {"name": "mqar_zoology", "settings": {"seq_lens": [32], "pairs": [4], "widths": [32, 64], "seeds": [0],
                                                 "solved": 0.9},
            "evidence": {"grid": {"softmax": {"T32-p4": {"32": {"accuracy": interval(0.99, 0.01), "test": [0.99]}}},
                                  "mamba": {"T32-p4": {"32": {"accuracy": interval(0.5), "test": [0.5]}}}}}}
    (tmp_path / "mqar.json").write_text(json.dumps(mqar))
    lines = frontier_tables.tasks_block(tmp_path / "state.json", tmp_path / "mqar.json").splitlines()
    assert lines[0] == ("| arm | parity, 1–3 bits | parity, 3–40 | parity, 40–256 | MQAR T 32, 4 pairs, width 32 | "
                        "MQAR T 32, 4 pairs, width 64 |")
    assert [line.split(" | ")[0] for line in lines[2:5]] == ["| `softmax`", "| `kda`", "| `mamba`"]
    assert lines[2].endswith("| 0.990 [0.980, 1.000] (1/1) | — |")  # width 64 not run
    assert lines[3].endswith("| 0.200 [0.100, 0.300] | — | — |") and lines[4].startswith("| `mamba` | — | — | — |")
    assert lines[4].endswith("| 0.500 [0.400, 0.600] (0/1) | — |")
    assert lines[-1] == ("95% intervals over seeds and examples (state_tracking_papers: 3 seeds; mqar_zoology: 1 "
                         "seed). (k/n): the seeds whose test accuracy is above 0.9, MQAR's solved.")


def test_the_sinks_table_gives_each_arms_first_key_share_its_difference_and_its_heaviest_head(tmp_path):
    def run(name, heads):  # an evaluated run: first-key share per layer and head at T (128) and at 512
        (tmp_path / name / "eval" / "sinks").mkdir(parents=True)
        results = {"train_seq_len": 128, "lengths": {"128": {"first_key": heads}, "512": {"first_key": heads}}}
        (tmp_path / name / "eval" / "sinks" / "results.json").write_text(json.dumps(results))
        return str(tmp_path / name)

    def arm(label, heads_by_seed):
        return {**row(label, 2.0), "runs": [run(f"{label}-s{i}", h) for i, h in enumerate(heads_by_seed)],
                "measurements": {"first_key": {"mean": 0.02, "sd": 0.001, "n": 2}},
                "measurements_by_length": {"first_key": {"512": {"mean": 0.005, "sd": 0.002, "n": 2}}}}

    record = {"baseline": "softmax", "tag": "sinks",
              "rows": [arm("kda", [[[0.5]]]), arm("fox", [[[0.01, 0.03]], [[0.05], [0.02]]]),
                       arm("softmax", [[[0.07]], [[0.09]]])],
              "differences": [{"label": "fox", "first_key": interval(-0.015, 0.001, True),
                               "first_key_by_length": {"512": interval(-0.004, 0.004, False)}},
                              {"label": "kda", "first_key": None}]}
    path = tmp_path / "comparison.json"
    assert frontier_tables.sinks_block(path).startswith("No kept comparison")
    path.write_text(json.dumps(record))
    lines = frontier_tables.sinks_block(path).splitlines()
    assert lines[0] == ("| arm | first-key share at T (± sd) | − softmax | at 512 (± sd) | − softmax | "
                        "largest head at T (seed mean) |")
    assert lines[2] == "| `softmax` | 0.020 ± 0.001 |  | 0.005 ± 0.002 |  | 0.080 |"  # mean of 0.07 and 0.09
    # fox: each seed's heaviest head (0.03, 0.05) averaged; its star only where the adjustment keeps it
    assert lines[3] == ("| `fox` | 0.020 ± 0.001 | −0.015 [−0.016, −0.014] * | 0.005 ± 0.002 | "
                        "−0.004 [−0.008, +0.000] | 0.040 |")
    assert lines[4].startswith("| `kda` | 0.020 ± 0.001 | — |")  # no attention arm: after them, by name
