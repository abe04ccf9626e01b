"""A seeded encyclopedia of fictional entities, its passages, and single- and multi-hop questions about it.

The offline stand-in for Wikipedia + NQ/HotpotQA: every name is invented, so no model can know an answer without
searching, and every fact is stated by exactly one sentence of exactly one passage. Each relation has one sentence
template (how the passage states the fact) and one question template (how a question asks for it); bridge
questions chain two relations through an intermediate entity, so they need two searches.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from components.errors import UserError
from components.syllables import NAME_SYLLABLES


PROFESSIONS = ["painter", "sailor", "chemist", "poet", "architect", "botanist", "weaver", "astronomer", "judge",
               "composer", "cartographer", "physician"]
ORG_KINDS = ["Guild", "Company", "Society", "Institute", "Bank", "Theatre", "Press", "Observatory"]


@dataclass(frozen=True)
class Relation:
    """One fact type: `subject_kind` --relation--> value (an entity of `value_kind`, or a literal)."""

    name: str
    subject_kind: str
    value_kind: str
    sentence: str  # how a passage states it; placeholders {subject} and {value}
    question: str  # how a single-hop question asks for it; placeholder {subject}


RELATIONS: dict[str, Relation] = {
    r.name: r
    for r in [
        Relation("birthplace", "person", "town", "{subject} was born in {value}.",
                 "Where was {subject} born?"),
        Relation("profession", "person", "literal", "The profession of {subject} was {value}.",
                 "What was the profession of {subject}?"),
        Relation("employer", "person", "organisation", "{subject} was a member of {value}.",
                 "Which organisation was {subject} a member of?"),
        Relation("country", "town", "literal", "{subject} is a town in {value}.",
                 "In which country is {subject}?"),
        Relation("town_founded", "town", "literal", "{subject} was founded in the year {value}.",
                 "In which year was {subject} founded?"),
        Relation("river", "town", "literal", "{subject} lies on the river {value}.",
                 "On which river does {subject} lie?"),
        Relation("headquarters", "organisation", "town", "{subject} has its seat in {value}.",
                 "Where does {subject} have its seat?"),
        Relation("founder", "organisation", "person", "{subject} was founded by {value}.",
                 "Who founded {subject}?"),
        Relation("org_founded", "organisation", "literal", "{subject} was established in the year {value}.",
                 "In which year was {subject} established?"),
    ]
}

# Bridge questions: (first relation, second relation, question). The first relation's value is an entity that the
# second relation is about; the question names only the first subject.
BRIDGES: list[tuple[str, str, str]] = [
    ("birthplace", "country", "In which country was {subject} born?"),
    ("birthplace", "river", "On which river lies the town where {subject} was born?"),
    ("birthplace", "town_founded", "In which year was the town where {subject} was born founded?"),
    ("employer", "headquarters", "Where does the organisation that {subject} was a member of have its seat?"),
    ("employer", "org_founded", "In which year was the organisation that {subject} was a member of established?"),
    ("founder", "birthplace", "Where was the founder of {subject} born?"),
    ("founder", "profession", "What was the profession of the founder of {subject}?"),
    ("headquarters", "country", "In which country does {subject} have its seat?"),
]


@dataclass
class Entity:
    """A fictional person, town or organisation with its facts (relation name -> value)."""

    name: str
    kind: str
    facts: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Passage:
    """One retrievable passage: the entity's article."""

    id: str
    title: str
    text: str

    def to_dict(self) -> dict:
        """The corpus line: ours (id, title, text) plus FlashRAG's `contents` ('"Title"\\ntext')."""
        return {"id": self.id, "title": self.title, "text": self.text, "contents": f'"{self.title}"\n{self.text}'}


class _NameMaker:
    """Unique invented names from the travel world's syllables (seeded): the copying that the tiny base learns on
    the QA task is then copying of the same kind of token sequence as travel names."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def word(self, syllables: int) -> str:
        return "".join(self.rng.choice(NAME_SYLLABLES) for _ in range(syllables)).capitalize()

    def unique(self, make) -> str:
        for _ in range(10_000):
            name = make()
            if name not in self.used:
                self.used.add(name)
                return name
        raise UserError("ran out of unique invented names: lower ood_qa.corpus.num_people/num_towns/"
                        "num_organisations")


def generate_entities(num_people: int, num_towns: int, num_organisations: int, seed: int) -> list[Entity]:
    """Sample the encyclopedia: towns first, then organisations seated in towns, then people born in towns and
    members of organisations; each organisation's founder is one of the people."""
    rng = random.Random(seed)
    names = _NameMaker(rng)
    countries = [names.unique(lambda: names.word(2) + "ia") for _ in range(max(2, num_towns // 6))]
    rivers = [names.unique(lambda: names.word(2)) for _ in range(max(2, num_towns // 3))]
    towns = [
        Entity(names.unique(lambda: names.word(rng.choice([2, 3]))), "town",
               {"country": rng.choice(countries), "town_founded": str(rng.randint(800, 1899)),
                "river": rng.choice(rivers)})
        for _ in range(num_towns)
    ]
    organisations = [
        Entity(names.unique(lambda: f"{names.word(2)} {rng.choice(ORG_KINDS)}"), "organisation",
               {"headquarters": rng.choice(towns).name, "org_founded": str(rng.randint(1700, 1999))})
        for _ in range(num_organisations)
    ]
    people = [
        Entity(names.unique(lambda: f"{names.word(2)} {names.word(rng.choice([2, 3]))}"), "person",
               {"birthplace": rng.choice(towns).name, "profession": rng.choice(PROFESSIONS),
                "employer": rng.choice(organisations).name})
        for _ in range(num_people)
    ]
    for organisation in organisations:
        organisation.facts["founder"] = rng.choice(people).name
    return towns + organisations + people


def passage_for(entity: Entity, index: int) -> Passage:
    """The entity's article: one sentence per fact, in a fixed relation order."""
    sentences = [RELATIONS[rel].sentence.format(subject=entity.name, value=value)
                 for rel, value in entity.facts.items()]
    return Passage(id=str(index), title=entity.name, text=" ".join(sentences))


def build_passages(entities: list[Entity]) -> list[Passage]:
    """One passage per entity, ids in entity order."""
    return [passage_for(entity, i) for i, entity in enumerate(entities)]


def single_hop_questions(entities: list[Entity], passages: list[Passage]) -> list[dict]:
    """Every (entity, relation) fact as a question whose answer is in the entity's passage."""
    questions = []
    for entity, passage in zip(entities, passages):
        for rel, value in entity.facts.items():
            questions.append({
                "question": RELATIONS[rel].question.format(subject=entity.name),
                "golden_answers": [value],
                "hops": [{"subject": entity.name, "relation": rel}],
                "gold_passages": [passage.id],
            })
    return questions


def multi_hop_questions(entities: list[Entity], passages: list[Passage]) -> list[dict]:
    """Every bridge (entity -rel1-> bridge entity -rel2-> answer) the encyclopedia supports."""
    by_name = {e.name: (e, p) for e, p in zip(entities, passages)}
    questions = []
    for entity, passage in zip(entities, passages):
        for first, second, template in BRIDGES:
            if first not in entity.facts:
                continue
            bridge, bridge_passage = by_name[entity.facts[first]]
            questions.append({
                "question": template.format(subject=entity.name),
                "golden_answers": [bridge.facts[second]],
                "hops": [{"subject": entity.name, "relation": first},
                         {"subject": bridge.name, "relation": second}],
                "gold_passages": [passage.id, bridge_passage.id],
            })
    return questions


def sample_questions(questions: list[dict], n: int, seed: int, dataset: str) -> list[dict]:
    """A seeded sample of `n` questions (all if fewer), each given an `id` and its `dataset` name."""
    rng = random.Random(seed)
    chosen = rng.sample(questions, min(n, len(questions)))
    return [{"id": f"{dataset}-{i}", "dataset": dataset, **q} for i, q in enumerate(chosen)]


@dataclass
class Encyclopedia:
    """The generated corpus and its question sets."""

    entities: list[Entity]
    passages: list[Passage]
    questions: dict[str, list[dict]]


def build_encyclopedia(num_people: int, num_towns: int, num_organisations: int, questions_per_dataset: int,
                       seed: int) -> Encyclopedia:
    """Generate entities, passages and the `single_hop` / `multi_hop` question sets.

    The base model's QA pre-training uses an encyclopedia built with another seed, so nothing it memorises there
    answers an evaluation question: only searching does.
    """
    entities = generate_entities(num_people, num_towns, num_organisations, seed)
    passages = build_passages(entities)
    pools = {"single_hop": single_hop_questions(entities, passages),
             "multi_hop": multi_hop_questions(entities, passages)}
    questions = {dataset: sample_questions(pool, questions_per_dataset, seed, dataset)
                 for dataset, pool in pools.items()}
    return Encyclopedia(entities, passages, questions)
