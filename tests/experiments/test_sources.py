"""Which source article each experiment reruns is said once (its module's ``SOURCE``), and docs/seeds.md and
docs/claims.md say the same."""

from __future__ import annotations

import re

import pytest

from lmzoo.experiments import ARTICLES, MODULES, load

from conftest import REPO

SEEDS_PAGE = (REPO / "docs" / "seeds.md").read_text()
CLAIMS_PAGE = (REPO / "docs" / "claims.md").read_text()


def experiments_of_article(number: str) -> set[str]:
    """The experiments docs/seeds.md's table lists for an article (``as 001`` refers to another row)."""
    row = next(line for line in SEEDS_PAGE.splitlines() if line.startswith(f"| {number} |"))
    last = row.rstrip(" |").rsplit("|", 1)[1].strip()
    if last.startswith("as "):
        return experiments_of_article(last.removeprefix("as "))
    return set(re.findall(r"`(\w+)`", last))


def claim_line(name: str) -> str:
    section = CLAIMS_PAGE.split(f"\n## {name}\n", 1)[1]
    return next(line for line in section.splitlines() if line.startswith("**Claim**"))


@pytest.mark.parametrize("name", MODULES)
def test_an_experiment_s_source_is_the_same_in_its_module_and_both_pages(name):
    source = load(name).SOURCE
    assert source is None or source in ARTICLES
    listed = {number for number in ARTICLES if name in experiments_of_article(number)}
    if source is None:
        assert not listed and "(beyond the source articles" in claim_line(name)
        assert f"`{name}`" in SEEDS_PAGE.split("go beyond the articles")[1].split("##")[0]
    else:
        assert source in listed and f"(source article {source}" in claim_line(name)


def test_every_article_is_on_the_page():
    headings = SEEDS_PAGE.replace("## 000 and 001", "## 000 ## 001")
    for number in ARTICLES:
        assert f"\n| {number} |" in SEEDS_PAGE and f"## {number}" in headings
