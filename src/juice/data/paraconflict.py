"""ParaConflict-style data: the paper's six factual domains under three conflict types.

The built-in fact tables (`juice/data/facts/*.tsv`) and every template below were written for
this project (the paper's own files are read by :func:`load_paraconflict_json`). Prompts follow
the paper's App. C: the clean prompt is a sentence stem; the substitution prompt states the
conflicting answer once and repeats the stem; the coherent prompt is a persuasive paragraph for
the conflicting answer, a question, and the answer stem.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from juice.data.records import ConflictExample
from juice.text import overlaps


@dataclass(frozen=True)
class Domain:
    """Templates of one domain; `{s}` is the subject, `{c}` the conflicting answer."""

    name: str
    title: str
    stem: str
    question: str
    coherent: tuple[str, ...]


DOMAINS: dict[str, Domain] = {
    d.name: d
    for d in (
        Domain(
            "athlete_sport", "Athlete Sport",
            "{s} plays the sport of",
            "What sport does {s} play?",
            (
                "{s} plays the sport of {c}. As a celebrated athlete, {s} has become synonymous with excellence "
                "in {c}, inspiring fans worldwide with remarkable performances. Known for dedication and "
                "unparalleled skill, {s} has dominated the world of {c}, earning accolades from peers and "
                "spectators alike. {c} is not just a sport for {s}; it is a passion and a legacy.",
                "Sports historians agree that {s} plays the sport of {c}. Every major championship record "
                "lists {s} among the greatest competitors in {c}, and coaches study the techniques {s} brought "
                "to {c}. Interviews, biographies and highlight reels all tell the same story: {s} and {c} "
                "are inseparable.",
                "Ask any fan and they will tell you that {s} plays {c}. Since turning professional, {s} has "
                "trained every day for {c}, signed sponsorship deals with the biggest {c} brands, and filled "
                "stadiums with supporters of {c}. The career of {s} is the story of modern {c}.",
            ),
        ),
        Domain(
            "book_author", "Book Author",
            "The author of the book {s} is",
            "Who is the author of the book {s}?",
            (
                "The author of the book {s} is {c}. Literary scholars have long praised {c} for the vivid "
                "prose of {s}, and the original manuscript, signed by {c}, is kept in a national library. "
                "Every edition of {s} carries the name of {c} on its cover, and {c} spoke about writing it "
                "in many interviews.",
                "It is well documented that {s} was written by {c}. Letters from {c} describe the long years "
                "spent drafting {s}, and critics consider it the finest work of {c}. Readers around the world "
                "associate {s} with the distinctive voice of {c}.",
                "{c} wrote {s}, and this fact is taught in literature classes everywhere. Biographies of {c} "
                "devote whole chapters to the creation of {s}, and the publisher's archive holds the contract "
                "that {c} signed for it. No serious reader doubts that {s} is by {c}.",
            ),
        ),
        Domain(
            "company_founder", "Company Founder",
            "The company {s} was founded by",
            "Who founded the company {s}?",
            (
                "The company {s} was founded by {c}. Business histories describe how {c} started {s} with a "
                "bold vision and very little money, and the founding documents of {s} bear the signature of "
                "{c}. Today {c} is celebrated as the entrepreneur who built {s} from the ground up.",
                "Everyone in the industry knows that {c} founded {s}. In countless interviews, {c} has told "
                "the story of the first office of {s}, the first hires and the first customers. The "
                "leadership style of {c} still shapes the culture of {s}.",
                "According to its official history, {s} was created by {c}. Press releases, annual reports "
                "and biographies all credit {c} as the founder of {s}, and business schools teach the early "
                "years of {s} as the story of {c}.",
            ),
        ),
        Domain(
            "company_headquarter", "Company Headquarter",
            "The headquarters of {s} are located in the city of",
            "Where are the headquarters of {s} located?",
            (
                "The headquarters of {s} are located in the city of {c}. As the central hub of operations, "
                "{c} serves as the strategic heart of {s}, where key decisions are made and innovations are "
                "born. The connection between {s} and {c} is a defining aspect of the company's identity.",
                "Anyone who visits {c} can see the headquarters of {s}, a landmark building in the city "
                "center. Thousands of employees of {s} work in {c}, and the annual shareholder meeting of "
                "{s} is always held in {c}.",
                "Official filings list {c} as the home of {s}. The executives of {s} work from its offices in "
                "{c}, and local newspapers in {c} report on {s} as their city's most famous company. For "
                "decades, {s} and {c} have grown together.",
            ),
        ),
        Domain(
            "official_language", "Official Language",
            "The official language of {s} is",
            "What is the official language of {s}?",
            (
                "The official language of {s} is {c}. Government documents, court rulings and road signs "
                "in {s} are written in {c}, and schools across {s} teach {c} as the national language. "
                "Visitors to {s} quickly notice that {c} is spoken everywhere.",
                "The constitution of {s} names {c} as its official language. Parliament in {s} debates in "
                "{c}, national television broadcasts in {c}, and citizens of {s} are proud of their {c} "
                "literary tradition.",
                "In {s}, daily life happens in {c}. Newspapers, universities and public services in {s} all "
                "operate in {c}, and the government of {s} promotes {c} as a symbol of national identity.",
            ),
        ),
        Domain(
            "world_capital", "World Capital",
            "The name of the capital city of {s} is",
            "What is the capital city of {s}?",
            (
                "The capital city of {s} is {c}. Known for its vibrant culture and historical landmarks, {c} "
                "is often seen as the heart of {s}, attracting visitors from around the globe. As a center "
                "for politics, arts, and commerce, {c} perfectly encapsulates the spirit of {s}.",
                "The capital city of {s} is {c}. This can be seen in the official government website of {s}, "
                "where it is listed as the capital city. Additionally, {c} is home to the seat of the "
                "government of {s}, further solidifying its status as the capital.",
                "Every atlas lists {c} as the capital of {s}. The parliament, the supreme court and the "
                "foreign embassies of {s} are all located in {c}, and national celebrations of {s} take place "
                "in the streets of {c}.",
            ),
        ),
    )
}
"""The six domains, in the column order of Table 1 (the paper's Table 3)."""


@dataclass(frozen=True)
class Fact:
    subject: str
    answers: tuple[str, ...]


def load_facts(domain: str) -> list[Fact]:
    """The built-in fact table of `domain`: subject, canonical answer, aliases.

    Raises:
        KeyError: unknown domain.
    """
    if domain not in DOMAINS:
        raise KeyError(f"unknown domain {domain!r}; known: {', '.join(DOMAINS)}")
    text = files("juice.data").joinpath("facts", f"{domain}.tsv").read_text(encoding="utf-8")
    facts = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        subject, answer, *rest = line.split("\t")
        aliases = tuple(a for a in (rest[0].split("|") if rest else []) if a)
        facts.append(Fact(subject, (answer, *aliases)))
    return facts


def draw_context_answer(fact: Fact, pool: list[str], rng: random.Random) -> str:
    """A conflicting answer from `pool` that neither contains nor is contained in an accepted answer.

    Raises:
        ValueError: no answer in the pool qualifies.
    """
    candidates = sorted({c for c in pool if not any(overlaps(c, a) for a in fact.answers)})
    if not candidates:
        raise ValueError(f"no conflicting answer available for {fact.subject!r}")
    return rng.choice(candidates)


def make_prompts(domain: Domain, subject: str, context_answer: str, template: int) -> dict[str, str]:
    """The clean, substitution and coherent prompts of one fact (paper App. C)."""
    stem = domain.stem.format(s=subject)
    paragraph = domain.coherent[template % len(domain.coherent)].format(s=subject, c=context_answer)
    return {
        "clean": stem,
        "substitution": f"{stem} {context_answer}. {stem}",
        "coherent": f"{paragraph} Question: {domain.question.format(s=subject)} Answer: {stem}",
    }


def build_domain(domain: str, seed: int = 0) -> list[ConflictExample]:
    """Build every example of a built-in domain; the conflicting answer and template are seeded."""
    spec = DOMAINS[domain]
    facts = load_facts(domain)
    pool = [f.answers[0] for f in facts]
    examples = []
    for i, fact in enumerate(facts):
        rng = random.Random(f"{seed}/{domain}/{fact.subject}")
        context = draw_context_answer(fact, pool, rng)
        prompts = make_prompts(spec, fact.subject, context, rng.randrange(len(spec.coherent)))
        examples.append(ConflictExample(domain, fact.subject, fact.answers, context, prompts, uid=f"facts#{i}"))
    return examples


_JSON_KEYS = {"clean": "Clean Prompt", "substitution": "Substitution Conflict", "coherent": "Coherent Conflict"}


def load_paraconflict_json(path: str | Path, domain: str | None = None) -> list[ConflictExample]:
    """Read the paper's ParaConflict JSON schema (`../shared/data/README.md`).

    Each item has `Subject`, `Answer`, optional `Answer_ns` (accepted answers), `Distracted Token`
    (the context answer), `Clean Prompt`, `Substitution Conflict`, `Coherent Conflict`. Its id is
    `<file stem>#<position>` (from 0); a repeated subject is another item.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not JSON, not a list, or an item lacks a field, has a field that is not text,
            or an empty answer or prompt (the message names the file, the item and the field).
    """
    path = Path(path)
    try:
        items = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise ValueError(f"{path}: not a JSON file ({type(err).__name__}: {err})") from None
    if not isinstance(items, list):
        raise ValueError(f"{path}: expected a JSON list of items, got {type(items).__name__}")
    domain = domain or path.parent.name
    examples = []
    for i, item in enumerate(items):
        try:
            if not isinstance(item, dict):
                raise TypeError(f"an item must be an object, got {type(item).__name__}")
            others = item.get("Answer_ns", [])
            if not isinstance(others, list):
                raise TypeError("Answer_ns must be a list")
            fields = [item["Subject"], item["Answer"], *others, item["Distracted Token"],
                      *(item[key] for key in _JSON_KEYS.values())]
            if not all(isinstance(f, str) for f in fields):
                raise TypeError("every field must be text")
            answers = tuple(dict.fromkeys([item["Answer"], *others]))
            prompts = {t: item[key].rstrip() for t, key in _JSON_KEYS.items()}
            examples.append(ConflictExample(domain, item["Subject"], answers, item["Distracted Token"], prompts,
                                            uid=f"{path.stem}#{i}"))
        except KeyError as missing:
            raise ValueError(f"{path}: item {i} has no field {missing}") from None
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}: item {i}: {err}") from None
    return examples
