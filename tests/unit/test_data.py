"""Built-in ParaConflict-style data, splits and the paper's JSON loader."""

from __future__ import annotations

import json

import pytest

from juice.data.paraconflict import DOMAINS, build_domain, load_facts, load_paraconflict_json
from juice.data.records import CONFLICT_TYPES, ConflictExample
from juice.data.splits import load_paper_splits, split_test
from juice.text import contains_answer, normalize_answer, overlaps

from helpers.data import authors_layout

MINIMUM = {d: 150 for d in DOMAINS} | {"company_founder": 100}


@pytest.mark.parametrize("domain", list(DOMAINS))
def test_fact_tables_are_large_enough_and_unique(domain):
    facts = load_facts(domain)
    assert len(facts) >= MINIMUM[domain]
    subjects = [f.subject for f in facts]
    assert len(subjects) == len(set(subjects)), "duplicate subjects"
    assert all(a.strip() for f in facts for a in f.answers)


@pytest.mark.parametrize("domain", list(DOMAINS))
def test_context_answer_is_never_an_accepted_answer(domain):
    for ex in build_domain(domain):
        assert not any(overlaps(ex.context_answer, a) for a in ex.answers), ex.subject
        # the EM metric must not count the context answer as correct
        assert not contains_answer(ex.context_answer, ex.answers), ex.subject


@pytest.mark.parametrize("domain", list(DOMAINS))
def test_every_prompt_is_well_formed(domain):
    spec = DOMAINS[domain]
    for ex in build_domain(domain):
        stem = spec.stem.format(s=ex.subject)
        p = ex.prompts
        assert set(p) == set(CONFLICT_TYPES)
        assert p["clean"] == stem
        assert p["substitution"] == f"{stem} {ex.context_answer}. {stem}"
        assert p["coherent"].endswith(f"Answer: {stem}")
        assert f"Question: {spec.question.format(s=ex.subject)}" in p["coherent"]
        assert ex.context_answer in p["coherent"] and ex.subject in p["coherent"]
        for text in p.values():
            assert "{" not in text and "}" not in text and not text.endswith(" ")
            assert not any(contains_answer(text, [a]) for a in ex.answers if len(normalize_answer(a)) > 3
                           and normalize_answer(a) not in normalize_answer(ex.subject)), (ex.subject, text)


def test_coherent_templates_per_domain():
    assert all(len(d.coherent) >= 3 for d in DOMAINS.values())
    used = {ex.prompts["coherent"].split(ex.subject)[0][:20] for ex in build_domain("world_capital")}
    assert len(used) >= 2


def test_building_is_seeded():
    a, b, c = build_domain("book_author", 0), build_domain("book_author", 0), build_domain("book_author", 1)
    assert [e.context_answer for e in a] == [e.context_answer for e in b]
    assert [e.context_answer for e in a] != [e.context_answer for e in c]


def test_splits_are_disjoint_and_seeded():
    examples = build_domain("world_capital")
    pool, test = split_test(examples, seed=3)
    assert {e.subject for e in pool}.isdisjoint({e.subject for e in test})
    assert len(pool) + len(test) == len(examples)
    assert split_test(examples, seed=3)[1] == test
    assert split_test(examples, seed=4)[1] != test


def test_empty_answers_are_refused():
    prompts = {t: "x is" for t in CONFLICT_TYPES}
    with pytest.raises(ValueError, match="non-empty"):
        ConflictExample("d", "s", ("",), "c", prompts)
    with pytest.raises(ValueError, match="context answer"):
        ConflictExample("d", "s", ("a",), " ", prompts)
    with pytest.raises(ValueError, match="no prompt"):
        ConflictExample("d", "s", ("a",), "c", {"clean": "x"})


def test_paper_json_loader_reads_every_row(shared_data):
    folder = shared_data / "paraconflict" / "world_capital"
    import json

    for path in sorted(folder.glob("*.json")):
        rows = json.loads(path.read_text())
        examples = load_paraconflict_json(path)
        assert len(examples) == len(rows) > 0
        for ex, row in zip(examples, rows):
            assert ex.answer == row["Answer"] and ex.context_answer == row["Distracted Token"]
            assert ex.prompts["coherent"] == row["Coherent Conflict"].rstrip()
    splits = load_paper_splits(folder)
    assert len(splits.head_set) == 4 and splits.validation and splits.test


def test_normalization():
    assert normalize_answer("The Hague") == "hague"
    assert normalize_answer("Bogotá!") == "bogota"
    # every non-word character, not only ASCII punctuation (PROTOCOL.md); compatibility forms fold
    assert normalize_answer("«Paris» — Île-de-France") == "paris ile de france"
    assert normalize_answer("Ｐａｒｉｓ") == "paris"
    assert contains_answer("« Paris »", ["Paris"])
    assert contains_answer(" Paris. It is the capital", ["Paris"])
    assert not contains_answer(" Parisian food", ["Paris"])
    assert contains_answer("Washington, D.C.", ["Washington, D.C."])
    assert not contains_answer("anything", [""])


def test_paper_layout_reads_every_domain_folder_and_one_domain_folder(shared_data, tmp_path):
    import shutil

    from juice.data.splits import load_paper_domains

    for name in ("world_capital", "capital_copy"):
        shutil.copytree(shared_data / "paraconflict" / "world_capital", tmp_path / name)
    (tmp_path / "notes").mkdir()   # a folder without split files is not a domain
    domains = load_paper_domains(tmp_path)
    assert list(domains) == ["capital_copy", "world_capital"]
    one = load_paper_domains(shared_data / "paraconflict" / "world_capital")
    assert list(one) == ["world_capital"]
    wc = one["world_capital"]
    subjects = [ex.subject for ex in wc.development]
    assert len(subjects) == len(set(subjects))                  # no subject twice
    paper = load_paper_splits(shared_data / "paraconflict" / "world_capital")
    assert wc.head_pool == paper.head_set and wc.pool == paper.validation   # the authors' files, kept apart
    assert subjects[:4] == [ex.subject for ex in paper.head_set]
    assert {ex.domain for ex in domains["capital_copy"].test} == {"capital_copy"}


def test_paper_layout_without_domains_is_a_clear_error(tmp_path):
    from juice.data.splits import load_paper_domains

    with pytest.raises(FileNotFoundError, match="no ParaConflict domain"):
        load_paper_domains(tmp_path)
    with pytest.raises(FileNotFoundError, match="no ParaConflict folder"):
        load_paper_domains(tmp_path / "missing")


def test_paper_layout_refuses_a_test_subject_that_is_also_in_the_pool(shared_data, tmp_path):
    import json
    import shutil

    from juice.data.splits import load_paper_domains

    folder = tmp_path / "world_capital"
    shutil.copytree(shared_data / "paraconflict" / "world_capital", folder)
    head = json.loads((folder / "head_finding_set_size_4.json").read_text())
    test = json.loads((folder / "unfiltered_test.json").read_text())
    (folder / "unfiltered_test.json").write_text(json.dumps([*test, head[0]]))
    with pytest.raises(ValueError, match="must be disjoint"):
        load_paper_domains(folder)


def test_direction_names_and_their_aliases():
    from juice.data.records import Direction

    assert Direction.parse("context") is Direction.CONTEXTUAL and Direction.parse(" Memory ") is Direction.PARAMETRIC
    assert Direction.CONTEXTUAL == "contextual" and f"{Direction.PARAMETRIC}" == str(Direction.PARAMETRIC) == "parametric"
    import json

    assert json.dumps({"d": Direction.CONTEXTUAL}) == '{"d": "contextual"}'
    with pytest.raises(ValueError, match="direction must be parametric"):
        Direction.parse("sideways")


def test_authors_layout_is_read_as_it_is_and_a_repeated_subject_is_two_items(shared_data, tmp_path):
    from juice.data.splits import find_paper_domains, load_paper_domains

    factual = authors_layout(shared_data, tmp_path)
    assert {d: p.name for d, p in find_paper_domains(factual).items()} == {
        "capital_copy": "head_size_4", "world_capital": "head_size_4"}
    domains = load_paper_domains(factual)
    test = domains["capital_copy"].test
    assert test[0].subject == test[1].subject and test[0].context_answer != test[1].context_answer
    assert [ex.uid for ex in test[:3]] == ["unfiltered_test#0", "unfiltered_test#1", "unfiltered_test#2"]
    assert len({ex.uid for ex in test}) == len(test)
    assert {ex.domain for ex in test} == {"capital_copy"}
    # one domain folder of that layout, and its head_size folder, name the domain too
    assert list(load_paper_domains(factual / "world_capital_gemma")) == ["world_capital"]
    assert list(load_paper_domains(factual / "world_capital_gemma" / "head_size_4")) == ["world_capital"]


def test_item_ids_come_from_where_the_item_is(shared_data):
    from juice.data.paraconflict import build_domain

    built = build_domain("world_capital")
    assert [ex.uid for ex in built[:2]] == ["facts#0", "facts#1"]
    made = ConflictExample("d", "s", ("a",), "c", {"clean": "x", "substitution": "y", "coherent": "z"})
    other = ConflictExample("d", "s", ("a",), "k", {"clean": "x", "substitution": "y", "coherent": "z"})
    assert made.uid.startswith("sha256:") and made.uid != other.uid      # content hash by default
    assert "uid" not in made.to_json()                                    # stage keys hold content only


def test_a_malformed_item_in_the_authors_layout_names_file_and_item(shared_data, tmp_path):
    from juice.data.splits import load_paper_domains

    factual = authors_layout(shared_data, tmp_path, repeat_test_subject=False)
    path = factual / "capital_copy_gemma" / "head_size_4" / "filtered_validation.json"
    rows = json.loads(path.read_text())
    del rows[2]["Answer"]
    path.write_text(json.dumps(rows))
    with pytest.raises(ValueError, match=r"filtered_validation.json: item 2 has no field 'Answer'"):
        load_paper_domains(factual)
