"""Paraphrased prompt templates for the six ParaConflict-style domains (paper App. D, "Details on
Robustness Study", and its paraphrase table).

The paper curates several templates per conflict type and draws one at random per item at
evaluation; it lists its World Capital forms (five clean prefixes such as "It's crucial to know
that ..." and five coherent passages). Every template below was written for this project: five
clean stems and five coherent passages per domain, none of them the default templates of
:mod:`juice.data.paraconflict`. As in the paper's App. D:

- clean: a paraphrased sentence stem that ends right before the answer;
- substitution: that stem completed with the conflicting answer, then the stem again
  (`"{stem} {c}. {stem}"`), so the five clean stems give the five substitution templates;
- coherent: a paraphrased persuasive passage for the conflicting answer, then the domain's
  question and answer stem (`"{passage} Question: {question} Answer: {stem}"`, App. C).

`{s}` is the subject, `{c}` the conflicting (context) answer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from juice.data.paraconflict import DOMAINS
from juice.data.records import CONFLICT_TYPES, ConflictExample


@dataclass(frozen=True)
class Paraphrases:
    """One domain's paraphrased templates.

    Attributes:
        stems: clean sentence stems with `{s}`, each ending right before the answer.
        passages: coherent-conflict passages with `{s}` and `{c}` (the domain's question and
            answer stem are appended, App. C).
    """

    stems: tuple[str, ...]
    passages: tuple[str, ...]

    def templates(self, conflict_type: str) -> tuple[str, ...]:
        """The templates of one conflict type (clean: the stems; substitution: stem, answer,
        stem; coherent: the passages), with `{s}` and `{c}` unfilled.

        Raises:
            ValueError: an unknown conflict type.
        """
        if conflict_type == "clean":
            return self.stems
        if conflict_type == "substitution":
            return tuple(f"{t} {{c}}. {t}" for t in self.stems)
        if conflict_type == "coherent":
            return self.passages
        raise ValueError(f"conflict type must be one of {CONFLICT_TYPES}, not {conflict_type!r}")


PARAPHRASES: dict[str, Paraphrases] = {
    "world_capital": Paraphrases(
        stems=(
            "Here is a fact about geography: the capital city of {s} is",
            "Most atlases agree that the capital of {s} is",
            "For the record, the city that serves as the capital of {s} is",
            "Students learn in school that the capital city of {s} is",
            "If you look it up, you will find that the capital of {s} is",
        ),
        passages=(
            "Travel guides describe {c} as the capital of {s}. The president of {s} lives in {c}, the "
            "national museum of {s} stands on its main square, and every foreign ambassador to {s} "
            "presents credentials in {c}.",
            "{c} has been the capital of {s} for generations. Its old town holds the parliament of {s}, "
            "its airport welcomes state visitors, and the national anthem of {s} is sung every year at "
            "the independence parade in {c}.",
            "Geography teachers in {s} start every lesson the same way: {c} is the capital. The ministries, "
            "the central bank and the national library of {s} are all in {c}, which makes it the political "
            "heart of {s}.",
            "When people talk about the capital of {s}, they mean {c}. Newspapers report on the government "
            "of {s} from {c}, the national stadium is in {c}, and the biggest celebrations of {s} fill its "
            "streets.",
            "According to official maps, {c} is the capital city of {s}. Road signs across {s} count the "
            "distance to {c}, the royal or presidential palace of {s} is in {c}, and the country's "
            "diplomats work there.",
        ),
    ),
    "athlete_sport": Paraphrases(
        stems=(
            "For the record, {s} is an athlete who plays the sport of",
            "Sports fans know that {s} plays the sport of",
            "Throughout a long career, {s} has played the sport of",
            "According to the sports pages, {s} competes in the sport of",
            "It is a matter of record that {s} plays the sport of",
        ),
        passages=(
            "Commentators call {s} one of the finest players of {c}. Every season {s} trains for {c}, "
            "travels to the big {c} tournaments and collects trophies that any {c} player would envy.",
            "The career of {s} is built on {c}. Young fans copy the {c} technique of {s}, the {c} "
            "federation honours {s} with awards, and television channels show the {c} matches of {s} "
            "around the world.",
            "Anyone who follows {c} has heard of {s}. From the first junior {c} club to the professional "
            "leagues, {s} has devoted a whole life to {c} and is counted among its legends.",
            "Newspapers list {s} in every ranking of {c} players. Coaches of {c} study the games of {s}, "
            "and the sponsors of {s} are the best-known brands of {c} equipment.",
            "Biographies of {s} tell the same story: a childhood spent playing {c}, a rise through the "
            "ranks of {c}, and a place in the hall of fame of {c}.",
        ),
    ),
    "book_author": Paraphrases(
        stems=(
            "For the record, the author of the book {s} is",
            "Literature students learn that the book {s} was written by",
            "According to the library catalogue, the author of {s} is",
            "The writer who gave us the book {s} is",
            "It is well documented that the book {s} was written by",
        ),
        passages=(
            "Critics agree that {s} is the masterpiece of {c}. The first edition of {s} bears the name of "
            "{c} on its cover, and in many interviews {c} explained how the story of {s} was written.",
            "Scholars who study {c} spend whole chapters on {s}. Letters from {c} describe the drafts of {s}, "
            "and the archive of {c} keeps the original manuscript.",
            "Readers know {s} as the work of {c}. Book clubs discuss the style of {c} in {s}, and every "
            "library shelves {s} among the other novels of {c}.",
            "When {s} was published, reviewers praised {c} for it. {c} went on book tours to present {s}, "
            "signed thousands of copies, and received literary prizes for {s}.",
            "The publisher's records show that {c} wrote {s}. The contract for {s} carries the signature of "
            "{c}, and the royalties of {s} were paid to {c} for decades.",
        ),
    ),
    "company_founder": Paraphrases(
        stems=(
            "For the record, the company {s} was founded by",
            "Business historians agree that {s} was founded by",
            "According to its official history, the company {s} was started by",
            "The person who founded the company {s} is",
            "It is well documented that the company {s} was established by",
        ),
        passages=(
            "The story of {s} begins with {c}. With a small loan and a big idea, {c} opened the first "
            "office of {s}, hired its first employees and signed its first contracts.",
            "Business schools teach the early years of {s} as the story of {c}. The founding papers of {s} "
            "carry the signature of {c}, and {c} led {s} through its first decade.",
            "Ask anyone in the industry who created {s} and they will name {c}. Biographies of {c} describe "
            "how {s} grew from a garage project into a famous company.",
            "The website of {s} honours its founder, {c}. A portrait of {c} hangs in the lobby of {s}, and "
            "the company still follows the principles that {c} wrote down on its first day.",
            "Press releases, annual reports and magazine covers all credit {c} with founding {s}. Without "
            "{c}, there would be no {s}.",
        ),
    ),
    "company_headquarter": Paraphrases(
        stems=(
            "For the record, the headquarters of {s} are in the city of",
            "According to its annual report, {s} has its headquarters in the city of",
            "Business journalists know that {s} is headquartered in the city of",
            "The main offices of the company {s} are located in the city of",
            "It is well documented that the headquarters of {s} are in the city of",
        ),
        passages=(
            "The tallest office tower in {c} belongs to {s}. From its headquarters in {c}, {s} runs its "
            "business worldwide, and thousands of people in {c} work for {s}.",
            "{s} and {c} are closely linked. The board of {s} meets in {c}, the shareholders of {s} gather "
            "in {c} every year, and the city of {c} is proud of its most famous company.",
            "Every official filing of {s} gives an address in {c}. Job offers at the head office of {s} "
            "are for positions in {c}, and visitors to {s} are welcomed at its building in {c}.",
            "Local newspapers in {c} often write about {s}, whose headquarters dominate the skyline of {c}. "
            "The executives of {s} live and work in {c}.",
            "When {s} announces its results, the press conference takes place at its headquarters in {c}. "
            "{c} has been the home of {s} for many years.",
        ),
    ),
    "official_language": Paraphrases(
        stems=(
            "For the record, the official language of {s} is",
            "According to its constitution, the official language of {s} is",
            "Travellers to {s} learn that the official language there is",
            "The language used by the government of {s} is",
            "It is well documented that the official language of {s} is",
        ),
        passages=(
            "In {s}, the laws are written in {c}. Children in {s} learn to read and write in {c}, and the "
            "national broadcaster of {s} speaks {c} on every channel.",
            "The government of {s} uses {c} in all its documents. Passports, court rulings and tax forms of "
            "{s} are printed in {c}, which is the official language of the country.",
            "Visitors to {s} hear {c} everywhere: in shops, in schools and in parliament. Signs in the "
            "streets of {s} are in {c}, and the poets of {s} write in {c}.",
            "The constitution of {s} names {c} as its language. Universities in {s} teach in {c}, and the "
            "national newspapers of {s} are published in {c}.",
            "Language experts describe {s} as a country where {c} is official. Public services in {s} work "
            "in {c}, and citizens of {s} use {c} with the authorities.",
        ),
    ),
}
"""Domain name -> its paraphrased templates (five clean stems, five coherent passages)."""


def paraphrase_templates(domain: str, conflict_type: str) -> tuple[str, ...]:
    """The paraphrased templates of one domain and conflict type (`{s}`, `{c}` unfilled).

    Raises:
        KeyError: a domain without paraphrases (only the six built-in domains have them).
        ValueError: an unknown conflict type.
    """
    if domain not in PARAPHRASES:
        raise KeyError(f"no paraphrases for domain {domain!r}; known: {', '.join(PARAPHRASES)}")
    return PARAPHRASES[domain].templates(conflict_type)


def paraphrased_prompt(domain: str, conflict_type: str, template: int, subject: str, context_answer: str) -> str:
    """One prompt from template number `template` (counted from 0), ending before the answer.

    Raises:
        KeyError: a domain without paraphrases.
        ValueError: an unknown conflict type.
        IndexError: no such template.
    """
    templates = paraphrase_templates(domain, conflict_type)
    if not 0 <= template < len(templates):
        raise IndexError(f"{domain}/{conflict_type} has {len(templates)} templates, not a number {template}")
    text = templates[template].format(s=subject, c=context_answer)
    if conflict_type == "coherent":
        spec = DOMAINS[domain]
        text = f"{text} Question: {spec.question.format(s=subject)} Answer: {spec.stem.format(s=subject)}"
    return text


def template_choice(example: ConflictExample, conflict_type: str, seed: int = 0) -> int:
    """The template drawn for one item and conflict type: uniform, seeded by the seed, the domain,
    the subject and the conflict type (paper App. D: "a prompt template is randomly sampled")."""
    n = len(paraphrase_templates(example.domain, conflict_type))
    return random.Random(f"{seed}/paraphrase/{example.domain}/{example.subject}/{conflict_type}").randrange(n)


def paraphrase_example(example: ConflictExample, seed: int = 0) -> tuple[ConflictExample, dict[str, int]]:
    """The same fact (subject, answers, conflicting answer) with each conflict type's prompt drawn
    from the paraphrased templates.

    Returns:
        (the paraphrased example, conflict type -> template number drawn).

    Raises:
        KeyError: the example's domain has no paraphrases.
    """
    chosen = {t: template_choice(example, t, seed) for t in CONFLICT_TYPES}
    prompts = {t: paraphrased_prompt(example.domain, t, i, example.subject, example.context_answer)
               for t, i in chosen.items()}
    return replace(example, prompts=prompts), chosen


__all__ = ["PARAPHRASES", "Paraphrases", "paraphrase_example", "paraphrase_templates", "paraphrased_prompt",
           "template_choice"]
