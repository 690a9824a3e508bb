"""``python -m lmzoo.experiments report``: the tables of docs/claims.md and the README's claims summary,
generated from the committed ``docs/claims/<name>/verdict.json`` files, so the two cannot disagree; and the
frontier tables of docs/frontier.md and docs/results.md from the kept records' comparison
(``lmzoo.experiments.frontier_tables``).

Each generated table sits between two markers, ``<!-- report:<block> begin -->`` and
``<!-- report:<block> end -->``; the prose around them stays hand-written. Blocks: ``summary``
(every experiment's outcome), ``checks:<name>`` (one experiment's checks), ``readme`` (the
README's short table), ``frontier`` and ``frontier:summary``. ``--check`` writes nothing and fails
when a committed table differs from what the JSON gives (a test runs it).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from lmzoo.experiments import MODULES, frontier_tables, load, read_committed_json
from lmzoo.experiments.judging import RULES_VERSION, TRAINING_NOISE_UNKNOWN

REPO = Path(__file__).resolve().parents[2]
CLAIMS_DIR = REPO / "docs" / "claims"
DOCUMENTS = tuple(REPO / name for name in ("docs/claims.md", "README.md", "docs/frontier.md", "docs/results.md"))
MARKER = re.compile(r"(<!-- report:(?P<name>[\w:]+) begin -->\n)(?P<body>.*?)(<!-- report:(?P=name) end -->)", re.S)


def verdicts(claims_dir: Path = CLAIMS_DIR) -> dict[str, dict | None]:
    """Each experiment's committed record, or None where it has none."""
    path = lambda name: claims_dir / name / "verdict.json"  # noqa: E731
    return {name: read_committed_json(path(name), "report", "a verdict.json file") if path(name).exists() else None
            for name in MODULES}


def number(x: float) -> str:
    if x is None or not math.isfinite(x):
        return "—"
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3f}" if abs(x) >= 0.01 or x == 0 else f"{x:.1e}"


def result(check: dict) -> str:
    if check["passed"] is None:
        return f"undecided ({check['undecided']})"
    return "passed" if check["passed"] else "**failed**"


def counts(record: dict) -> str:
    claims = [c for c in record["checks"] if not c["control"]]
    controls = [c for c in record["checks"] if c["control"]]
    passed = sum(c["passed"] is True for c in claims)
    failed = sum(c["passed"] is False for c in claims)
    text = f"{passed} passed, {failed} failed, {len(claims) - passed - failed} undecided of {len(claims)}"
    if controls:
        text += f"; controls: {sum(c['passed'] is True for c in controls)} of {len(controls)} passed"
    return text


def provenance(record: dict) -> str:
    """How the verdict came about: a run under the current rules, or older evidence re-judged by them."""
    if record.get("rules_version") != RULES_VERSION:
        return f"judged under older rules (version {record.get('rules_version', 1)})"
    if "rejudged" in record:
        before = record["rejudged"]
        return f"re-judged from a run judged {before['verdict']} under rules version {before['rules_version']}"
    return "run under the current rules"


def seeds_per_arm(record: dict) -> int:
    seeds = record["settings"].get("seeds")
    return len(seeds) if seeds else 1


def next_step(name: str, record: dict | None) -> str:
    command = f"`python -m lmzoo.experiments {name}`"
    if record is None:
        return f"not yet run under the current rules: {command}"
    wanted = getattr(load(name).Settings(), "seeds", [])
    if seeds_per_arm(record) < len(wanted) or any(c["undecided"] == TRAINING_NOISE_UNKNOWN for c in record["checks"]):
        return f"not yet rerun with {len(wanted)} seeds per arm: {command}"
    if any(text_only_switch(c) for c in record["checks"]):
        return (f"switch intervals are text only, recorded before checkpoint-to-checkpoint variation counted: "
                f"rerun {command}")
    return ""


def text_only_switch(check: dict) -> bool:
    """An evaluation-time switch over several checkpoints judged on the text alone: recorded before
    ``lmzoo.stats.trained_models.switch_difference`` counted how much the switch's effect differs between
    checkpoints."""
    return check["uncertainty"] == "text" and max(check["seeds"]) > 1


def source(name: str) -> str:
    """The source article an experiment reruns (docs/seeds.md), or — beyond them."""
    return load(name).SOURCE or "—"


def summary_table(records: dict) -> str:
    lines = ["| experiment | source article | verdict | checks | seeds per arm | how judged | wall time | to do |",
             "|---|---|---|---|---:|---|---:|---|"]
    for name, record in records.items():
        link = f"[`{name}`](#{name})"
        if record is None:
            lines.append(f"| {link} | {source(name)} | — | — | — | — | — | {next_step(name, record)} |")
            continue
        lines.append(f"| {link} | {source(name)} | **{record['verdict']}** | {counts(record)} | "
                     f"{seeds_per_arm(record)} | {provenance(record)} | {record['seconds']:.0f} s | "
                     f"{next_step(name, record)} |")
    return "\n".join(lines) + "\n"


def level(check: dict) -> str:
    """The interval's coverage: 95% for controls, family-wise over the claim checks otherwise."""
    return f"{100 * check.get('level', 0.95):.3g}%"


def checks_table(record: dict | None, name: str) -> str:
    if record is None:
        return f"No committed verdict.json: {next_step(name, record)}.\n"
    lines = [f"**{record['verdict']}**: {record['reason']}.", "",
             "| check | what it tests | measured | interval (level) | interval covers | must be | result |",
             "|---|---|---:|---:|---|---|---|"]
    for c in record["checks"]:
        label = f"{c['name']} (control)" if c["control"] else c["name"]
        lines.append(f"| {label} | {c['tests']} | {number(c['estimate'])} | "
                     f"[{number(c['lo'])}, {number(c['hi'])}] ({level(c)}) | "
                     f"{c['uncertainty']}, seeds {'/'.join(map(str, c['seeds']))} | {c['must']} | {result(c)} |")
    return "\n".join(lines) + "\n"


def readme_table(records: dict) -> str:
    lines = ["| experiment | verdict | why |", "|---|---|---|"]
    for name, record in records.items():
        if record is None:
            lines.append(f"| `{name}` | — | {next_step(name, record)} |")
        else:
            lines.append(f"| `{name}` | **{record['verdict']}** | {record['reason']} |")
    return "\n".join(lines) + "\n"


def blocks(claims_dir: Path = CLAIMS_DIR) -> dict[str, str]:
    records = verdicts(claims_dir)
    generated = {"summary": summary_table(records), "readme": readme_table(records)}
    generated.update({f"checks:{name}": checks_table(record, name) for name, record in records.items()})
    return generated | frontier_tables.blocks()


def fill(text: str, generated: dict[str, str]) -> str:
    """``text`` with every marked block replaced by its generated table (unknown blocks are an error)."""
    def replace(match: re.Match) -> str:
        if match["name"] not in generated:
            raise KeyError(f"no generated table named {match['name']!r}")
        return match.group(1) + generated[match["name"]] + match.group(4)
    return MARKER.sub(replace, text)


def stale(documents=DOCUMENTS, claims_dir: Path = CLAIMS_DIR) -> list[Path]:
    """The documents whose generated tables differ from what the committed JSON gives."""
    generated = blocks(claims_dir)
    return [path for path in documents if fill(path.read_text(), generated) != path.read_text()]


def write(documents=DOCUMENTS, claims_dir: Path = CLAIMS_DIR) -> list[Path]:
    """Regenerate the tables in place; the documents that changed."""
    changed = stale(documents, claims_dir)
    generated = blocks(claims_dir)
    for path in changed:
        path.write_text(fill(path.read_text(), generated))
    return changed
