"""Invented names (components/travel/names.py): which words an agent coined, and where each left the known names."""
from hypothesis import given
from hypothesis import strategies as st

from components.travel.names import (FORMAT_WORDS, NAME_WORD, InventedName, KnownNames, episode_invented_names,
                                     invented_names)

WORLD = {"Sellenash", "Thalwel", "Brita", "Baash", "Retreat"}


def known() -> KnownNames:
    return KnownNames(WORLD | FORMAT_WORDS)


def test_each_coined_word_slips_where_it_leaves_every_known_word():
    text = "from Sellen to Thalwelash, Briashhel Studio, Brita"
    assert invented_names(text, known()) == [
        InventedName("Sellen", 5, 11),       # a prefix of Sellenash: it stopped short, the slip is the next character
        InventedName("Thalwelash", 15, 22),  # ran on past Thalwel
        InventedName("Briashhel", 27, 30),   # "Bri" begins Brita; "Bria" begins nothing
        InventedName("Studio", 37, 38),      # "S" begins Sellenash
    ]


def test_format_words_world_words_and_what_the_agent_was_shown_are_not_invented():
    names = known()
    assert invented_names("Day 1: Baash Retreat. Then Route: Sellenash -> Thalwel", names) == []
    assert [n.word for n in invented_names("Zorka Diner, Thalwel", names)] == ["Zorka", "Diner"]
    names.learn("<tool_response>Zorka Diner\t40</tool_response>")
    assert invented_names("Zorka Diner, Thalwel", names) == []


def test_with_seen_a_word_is_counted_where_it_was_first_written():
    seen: set[str] = set()
    assert [n.start for n in invented_names("Sellen, Sellen", known(), seen)] == [0]
    assert invented_names("Sellen again", known(), seen) == [] and seen == {"Sellen"}


def test_a_name_echoed_back_by_an_error_does_not_excuse_the_turn_that_coined_it():
    messages = [
        {"role": "system", "content": "Plan the trip."},
        {"role": "user", "content": "From Sellenash to Thalwel."},
        {"role": "assistant", "content": "<think>Route: Sellenash -> Thallen</think>"},
        {"role": "user", "content": "<tool_response>\nUnknown city 'Thallen'.\n</tool_response>"},
        {"role": "assistant", "content": "<think>Thallen is Thalwel; Thallen again</think>"},
    ]
    assert episode_invented_names(messages, world_words=set()) == [InventedName("Thallen", 27, 31)]


@given(st.text(alphabet=st.sampled_from(list("SsTtBbaeilnrh ,.-\"'\n")), max_size=80),
       st.lists(st.text(alphabet="abcdefghij", min_size=1, max_size=8).map(str.capitalize), max_size=6))
def test_invented_names_never_raises_and_every_slip_lies_inside_its_word(text, extra):
    names = KnownNames(set(extra) | WORLD)
    seen: set[str] = set()
    found = invented_names(text, names, seen)
    words = [m.group() for m in NAME_WORD.finditer(text)]
    assert [n.word for n in found] == [w for i, w in enumerate(words)
                                       if w not in names.words and w not in words[:i]]
    for name in found:
        assert text[name.start:name.start + len(name.word)] == name.word
        assert name.start <= name.slip <= name.start + len(name.word)
        assert any(known_word.startswith(name.word[: name.slip - name.start]) for known_word in names.words) \
            or name.slip == name.start
