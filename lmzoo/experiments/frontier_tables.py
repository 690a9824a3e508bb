"""The frontier tables of docs/frontier.md and docs/results.md, generated from the kept records' comparison
(``docs/frontier/records/comparison.json``, written by ``scripts/cpu_recipe.sh`` through ``lmzoo.compare``), so
that adding an arm cannot leave a typed table behind. ``report`` fills them in like the claims tables.
"""

from __future__ import annotations

from pathlib import Path

from lmzoo.experiments import read_committed_json

REPO = Path(__file__).resolve().parents[2]
FRONTIER_COMPARISON = REPO / "docs" / "frontier" / "records" / "comparison.json"


def plain(x: float) -> str:
    return f"{x:.3f}".replace("-", "−")


def signed(x: float) -> str:
    return f"{x:+.3f}".replace("-", "−")


def interval(c: dict | None, fmt=plain) -> str:
    """``estimate [lo, hi]``; a difference (``p_adjusted`` present) gets `` *`` where it survives Holm's adjustment."""
    if not c:
        return "—"
    star = " *" if c.get("significant_adjusted") else ""
    return f"{fmt(c['estimate'])} [{fmt(c['lo'])}, {fmt(c['hi'])}]{star}"


def spread(summary: dict | None) -> str:
    """``mean ± sd`` over an arm's seeds (the mean alone for one seed)."""
    if not summary or summary.get("mean") is None:
        return "—"
    sd = summary.get("sd")
    return plain(summary["mean"]) + (f" ± {plain(sd)}" if sd is not None else "")


def count(n: int | None) -> str:
    return f"{n:,}" if n is not None else "—"


def lengths(record: dict) -> list[str]:
    return sorted({n for row in record["rows"] for n in row["ratio"]}, key=int)


def differences_by_label(record: dict) -> dict[str, dict]:
    return {d["label"]: d for d in record["differences"]}


def arms(record: dict) -> list[tuple[dict, dict | None]]:
    """Each arm's row and its difference to the baseline: the baseline first, then the rest by label."""
    differences = differences_by_label(record)
    rows = sorted(record["rows"], key=lambda r: (r["label"] != record["baseline"], r["label"]))
    return [(row, differences.get(row["label"])) for row in rows]


def sparsity(row: dict) -> dict | None:
    return row.get("measurements", {}).get("sparsity")


def full_table(record: dict) -> str:
    """Every arm: bpb at T, its difference to the baseline, the ratios at every length, mean S."""
    ns, base = lengths(record), record["baseline"]
    header = ["arm", "seeds", "parameters", "bpb at T [95%]", f"− {base} at T",
              *(f"bpb@{n}/bpb@T" for n in ns), f"− {base}, ratio at {ns[-1]}", "mean S at T (± sd over seeds)",
              f"− {base}, mean S (seeds)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row, diff in arms(record):
        d = diff or {}
        cells = [f"`{row['label']}`", str(len(row["runs"])), count(row.get("params")),
                 interval(row["bpb"]), interval(d.get("bpb"), signed) if diff else "",
                 *(interval(row["ratio"].get(n)) for n in ns),
                 interval(d.get("ratio", {}).get(ns[-1]), signed) if diff else "", spread(sparsity(row)),
                 interval(d.get("sparsity"), signed) if diff else ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def summary_table(record: dict) -> str:
    """The short table of docs/results.md: the arms ordered by their difference at T, the baseline where the
    differences change sign."""
    ns, base = lengths(record), record["baseline"]
    baseline, *others = arms(record)
    others.sort(key=lambda arm: arm[1]["bpb"]["estimate"])
    row = baseline[0]
    reference = (f"| `{base}` (reference) | {count(row.get('params'))} | {interval(row['bpb'])} bpb | "
                 f"{interval(row['ratio'].get(ns[-1]))} | {spread(sparsity(row))} |")
    lines = [f"| `+attn=` | parameters | bpb at T − {base} | bpb@{ns[-1]} / bpb@T | mean S at T − {base} (seeds) |",
             "|---|---|---|---|---|"]
    placed = False
    for row, diff in others:
        if not placed and diff["bpb"]["estimate"] >= 0:
            lines.append(reference)
            placed = True
        lines.append(f"| `{row['label']}` | {count(row.get('params'))} | {interval(diff['bpb'], signed)} | "
                     f"{interval(row['ratio'].get(ns[-1]))} | {interval(diff.get('sparsity'), signed)} |")
    if not placed:
        lines.append(reference)
    return "\n".join(lines) + "\n" + legend(record, others)


def legend(record: dict, others: list[tuple[dict, dict]]) -> str:
    """How many arms the adjustment counts, and which differences at T hold at 95% only before it."""
    base = record["baseline"]
    unstarred = [f"`{row['label']}`" for row, diff in others
                 if diff["bpb"]["significant"] and not diff["bpb"]["significant_adjusted"]]
    text = (f"\n`*`: the interval excludes zero after Holm's adjustment over the {len(others)} arms compared with "
            f"{base} (each column one family).")
    if unstarred:
        text += (f" Differences at T that exclude zero at 95% on their own but not after the adjustment: "
                 f"{', '.join(unstarred)}.")
    return text + "\n"


# The attention arms (and log-linear Mamba-2, whose levels act as one) set beside three references, in this order
ATTENTION_ARMS = ("softmax", "fox", "swa", "gated_softmax", "nsa", "dsa", "moba", "stickbreaking", "path",
                  "deltaformer", "log_linear_mamba2")
REFERENCES = ("softmax", "fox", "swa")
VERSUS = REPO / "docs" / "frontier" / "versus"  # <reference>/comparison.json: the records compared with it


def reference_comparison(reference: str) -> Path:
    return FRONTIER_COMPARISON if reference == REFERENCES[0] else VERSUS / reference / "comparison.json"


def versus(differences: dict[str, dict[str, dict]], arm: str, key: str, length: str | None = None) -> list[str]:
    """One arm's difference to each reference (``differences``: reference -> label -> difference) in ``key`` (at
    ``length`` where given): blank against itself."""
    cells = []
    for reference, by_label in differences.items():
        d = by_label.get(arm, {})
        value = d.get(key) if length is None else d.get(key, {}).get(length)
        cells.append("" if arm == reference else interval(value, signed))
    return cells


def attention_tables(compared: dict[str, dict]) -> str:
    """S at T and at the longest length, then the ratio there, of every attention arm, minus each reference (each
    difference from the comparison whose baseline that reference is)."""
    first = compared[REFERENCES[0]]
    longest = lengths(first)[-1]
    rows = {row["label"]: row for row in first["rows"]}
    shown = [arm for arm in ATTENTION_ARMS if arm in rows]
    differences = {reference: differences_by_label(record) for reference, record in compared.items()}
    minus = [f"− {reference}" for reference in compared]
    s_header = ["arm", "S at T (± sd)", *minus, f"S at {longest} (± sd)", *minus]
    r_header = ["arm", f"bpb@{longest}/bpb@T", *minus]
    s_lines = ["| " + " | ".join(s_header) + " |", "|" + "---|" * len(s_header)]
    r_lines = ["| " + " | ".join(r_header) + " |", "|" + "---|" * len(r_header)]
    for arm in shown:
        row = rows[arm]
        at_longest = row.get("measurements_by_length", {}).get("sparsity", {}).get(longest)
        s_lines.append("| " + " | ".join([f"`{arm}`", spread(sparsity(row)), *versus(differences, arm, "sparsity"),
                                          spread(at_longest), *versus(differences, arm, "sparsity_by_length", longest)])
                       + " |")
        r_lines.append("| " + " | ".join([f"`{arm}`", interval(row["ratio"].get(longest)),
                                          *versus(differences, arm, "ratio", longest)]) + " |")
    return "\n".join(s_lines) + "\n\n" + "\n".join(r_lines) + "\n"


def comparison_record(path: Path, *also: str) -> dict:
    """A kept comparison.json (holding the keys ``also`` too), or ConfigError naming the file where it is not one."""
    return read_committed_json(path, "report", "a comparison.json file of lmzoo.compare",
                               ("rows", "differences", "baseline", *also))


def shown(path: Path) -> str:
    """``path`` from the repository root where it lies inside it."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def attention_block() -> str:
    paths = {reference: reference_comparison(reference) for reference in REFERENCES}
    absent = [shown(path) for path in paths.values() if not path.exists()]
    if absent:
        return f"No kept comparison at {', '.join(absent)}: run the three comparisons above.\n"
    return attention_tables({reference: comparison_record(path) for reference, path in paths.items()})


# Where the attention arms put weight on the first key (attention sinks): lmzoo.compare with tag=sinks on their
# records, each evaluated at T and 8T with eval.tag=sinks (docs/frontier.md gives the commands)
SINKS = REPO / "docs" / "frontier" / "sinks" / "comparison.json"


def largest_head(row: dict, tag: str) -> str:
    """The highest per-head first-key share at the training length, averaged over the arm's runs (each run's
    ``eval/<tag>/results.json``, its path as compare recorded it, from the repository root)."""
    shares = []
    for run in row["runs"]:
        results = read_committed_json(REPO / run / "eval" / tag / "results.json", "report",
                                      "an evaluation's results.json", ("lengths", "train_seq_len"))
        by_head = results["lengths"].get(str(results["train_seq_len"]), {}).get("first_key")  # not measured: "—"
        if by_head is None:
            return "—"
        shares.append(max(share for layer in by_head for share in layer))
    return plain(sum(shares) / len(shares))


def sinks_table(record: dict) -> str:
    """Each attention arm's first-key share at T and at the longest length (mean ± sd over seeds), its difference
    to the baseline there, and its most first-key-heavy head at T."""
    longest, base = lengths(record)[-1], record["baseline"]
    rows = {row["label"]: row for row in record["rows"]}
    differences = differences_by_label(record)
    header = ["arm", "first-key share at T (± sd)", f"− {base}", f"at {longest} (± sd)", f"− {base}",
              "largest head at T (seed mean)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for arm in [a for a in ATTENTION_ARMS if a in rows] + sorted(set(rows) - set(ATTENTION_ARMS)):
        row, d = rows[arm], differences.get(arm, {})
        at_longest = row.get("measurements_by_length", {}).get("first_key", {}).get(longest)
        cells = [f"`{arm}`", spread(row.get("measurements", {}).get("first_key")),
                 interval(d.get("first_key"), signed) if arm != base else "", spread(at_longest),
                 interval(d.get("first_key_by_length", {}).get(longest), signed) if arm != base else "",
                 largest_head(row, record["tag"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def sinks_block(path: Path = SINKS) -> str:
    if not path.exists():
        return f"No kept comparison at {shown(path)}: run the commands above.\n"
    return sinks_table(comparison_record(path, "tag"))


# The recall and state-tracking yardsticks run on the frontier arms (docs/frontier.md gives the commands): each
# experiment's verdict.json, its runs' records beside it
TASKS = REPO / "docs" / "frontier" / "tasks"
STATE_TRACKING = TASKS / "state_tracking" / "verdict.json"  # state_tracking_papers, the parity column
MQAR = TASKS / "mqar" / "verdict.json"  # mqar_zoology


def task_verdict(path: Path) -> dict | None:
    if not path.exists():
        return None
    return read_committed_json(path, "report", "a verdict.json file", ("name", "evidence", "settings"))


def parity_columns(record: dict) -> tuple[list[str], dict[str, list[str]]]:
    """The header and each arm's cells of the parity column of a state_tracking_papers record: scaled accuracy on
    the control's strings, in the training range and at the test lengths."""
    s = record["settings"]
    scores = record["evidence"]["columns"]["parity"]["scaled_accuracy"]
    ranges = {"control": "1–3 bits", "train": f"{s['train_min']}–{s['train_len']}",
              "test": f"{s['test_min']}–{s['test_max']}"}
    header = [f"parity, {span}" for span in ranges.values()]
    return header, {arm: [interval(score[name]) for name in ranges] for arm, score in scores.items()}


def mqar_columns(record: dict) -> tuple[list[str], dict[str, list[str]]]:
    """The header and each variant's cells of an mqar_zoology record: test accuracy at every setting and width,
    and how many seeds solved it (a seed either leaves MQAR's plateau or stays on it, which a mean hides)."""
    s, grid = record["settings"], record["evidence"]["grid"]
    cells = [(f"T{n}-p{p}", str(width), f"MQAR T {n}, {p} pairs, width {width}")
             for n, p in zip(s["seq_lens"], s["pairs"]) for width in s["widths"]]

    def cell(scores: dict) -> str:
        tests = scores.get("test")
        solved = f" ({sum(a > s['solved'] for a in tests)}/{len(tests)})" if tests and "solved" in s else ""
        return interval(scores.get("accuracy")) + solved

    return [title for *_, title in cells], {
        variant: [cell(by_setting.get(setting, {}).get(width, {})) for setting, width, _ in cells]
        for variant, by_setting in grid.items()}


def tasks_block(state_tracking: Path = STATE_TRACKING, mqar: Path = MQAR) -> str:
    """Every frontier arm's parity and MQAR scores beside each other ("—" where an arm was not run on one)."""
    parts = [(columns(record), record) for columns, record in
             ((parity_columns, task_verdict(state_tracking)), (mqar_columns, task_verdict(mqar))) if record]
    if not parts:
        return "Not run yet: the commands above write the verdicts this table is made from.\n"
    header = ["arm"] + [title for (titles, _), _ in parts for title in titles]
    arms = list(dict.fromkeys(arm for (_, cells), _ in parts for arm in cells))
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for arm in arms:
        row = [cell for (titles, cells), _ in parts for cell in cells.get(arm, ["—"] * len(titles))]
        lines.append("| " + " | ".join([f"`{arm}`", *row]) + " |")
    seeds = "; ".join(f"{record['name']}: {n} seed{'s' * (n != 1)}" for _, record in parts
                      for n in [len(record["settings"]["seeds"])])
    solved = [f" (k/n): the seeds whose test accuracy is above {record['settings']['solved']:g}, MQAR's solved."
              for _, record in parts if record["name"] == "mqar_zoology" and "solved" in record["settings"]]
    return "\n".join(lines) + f"\n\n95% intervals over seeds and examples ({seeds}).{''.join(solved)}\n"


def blocks(path: Path = FRONTIER_COMPARISON) -> dict[str, str]:
    tasks = {"frontier:tasks": tasks_block(), "frontier:sinks": sinks_block()}
    if not path.exists():
        missing = f"No kept comparison at {shown(path)}: run scripts/cpu_recipe.sh as above.\n"
        return {"frontier": missing, "frontier:summary": missing, "frontier:attention": missing, **tasks}
    record = comparison_record(path)
    return {"frontier": full_table(record), "frontier:summary": summary_table(record),
            "frontier:attention": attention_block(), **tasks}
