"""The generated encyclopedia and the retrievers behind the `search` tool."""
from __future__ import annotations

import json

import httpx
import pytest

from components.errors import UserError
from components.qa.corpus import build_encyclopedia
from components.qa.ood import CorpusParams, retrieval_recall
from components.retrieval import BM25Retriever, HTTPRetriever, format_passages, passage_from_record


@pytest.fixture(scope="module")
def encyclopedia():
    """The default (tiny preset) evaluation encyclopedia."""
    c = CorpusParams()
    return build_encyclopedia(c.num_people, c.num_towns, c.num_organisations, questions_per_dataset=200, seed=c.seed)


def test_the_encyclopedia_is_seeded_and_every_answer_is_stated_in_its_gold_passage(encyclopedia):
    again = build_encyclopedia(300, 60, 40, questions_per_dataset=200, seed=0)
    other = build_encyclopedia(300, 60, 40, questions_per_dataset=200, seed=1)
    passages = {p.id: p.text for p in encyclopedia.passages}

    assert [p.text for p in again.passages] == list(passages.values())
    assert [p.title for p in other.passages] != [p.title for p in encyclopedia.passages]
    assert len({p.title for p in encyclopedia.passages}) == len(encyclopedia.passages)  # names are unique
    for question in encyclopedia.questions["single_hop"] + encyclopedia.questions["multi_hop"]:
        assert question["golden_answers"][0] in passages[question["gold_passages"][-1]]
        assert question["golden_answers"][0] not in question["question"]  # the question does not give it away


def test_multi_hop_questions_name_only_the_first_entity(encyclopedia):
    for question in encyclopedia.questions["multi_hop"]:
        first, bridge = question["hops"]
        assert first["subject"] in question["question"]
        assert bridge["subject"] not in question["question"]
        assert len(question["gold_passages"]) == 2


def test_bm25_finds_the_gold_passage_of_single_hop_questions_in_its_top_5(encyclopedia):
    retriever = BM25Retriever([p.to_dict() for p in encyclopedia.passages], top_k=5)

    recall = retrieval_recall(encyclopedia.questions["single_hop"], retriever)

    assert recall >= 0.95, f"recall@5 {recall:.3f}"


def test_bm25_returns_nothing_for_a_query_of_stop_words_only(encyclopedia):
    retriever = BM25Retriever([p.to_dict() for p in encyclopedia.passages], top_k=3)
    assert retriever.search("what is the") == []
    assert format_passages([]) == "No results."


def test_passages_render_as_search_r1_documents():
    text = format_passages([{"id": "7", "title": "Nikrom", "text": "Nikrom is a town in Zotrilia."},
                            {"id": "8", "title": "Kruna", "text": "Kruna lies on the river Fehuth."}])
    assert text == ("Doc 1(Title: Nikrom) Nikrom is a town in Zotrilia.\n"
                    "Doc 2(Title: Kruna) Kruna lies on the river Fehuth.")


def test_flashrag_corpus_lines_are_read_as_title_and_text():
    assert passage_from_record({"id": 3, "contents": '"Nikrom"\nNikrom is a town.'}) == {
        "id": "3", "title": "Nikrom", "text": "Nikrom is a town."}
    with pytest.raises(UserError, match="FlashRAG"):
        passage_from_record({"id": 3, "body": "?"})


def test_http_retriever_speaks_the_search_r1_retrieve_convention():
    seen = {}

    def server(request: httpx.Request) -> httpx.Response:
        seen.update(json.loads(request.content))
        hits = [[{"document": {"id": "1", "contents": f'"Doc for {q}"\ntext about {q}'}, "score": 1.5}]
                for q in seen["queries"]]
        return httpx.Response(200, json={"result": hits})

    retriever = HTTPRetriever("http://retriever/retrieve", top_k=2,
                              client=httpx.Client(transport=httpx.MockTransport(server)))

    assert retriever.search("Nikrom") == [{"id": "1", "title": "Doc for Nikrom", "text": "text about Nikrom"}]
    assert seen == {"queries": ["Nikrom"], "topk": 2, "return_scores": True}


def test_http_retriever_failure_says_how_to_fix_it():
    retriever = HTTPRetriever("http://retriever/retrieve", client=httpx.Client(
        transport=httpx.MockTransport(lambda request: httpx.Response(503, text="loading index"))))
    with pytest.raises(UserError, match="retriever.kind: bm25"):
        retriever.search("Nikrom")


def test_http_retriever_failure_does_not_show_the_token_in_its_url():
    retriever = HTTPRetriever("http://retriever/retrieve?token=abc123", client=httpx.Client(
        transport=httpx.MockTransport(lambda request: httpx.Response(401, text="bad token"))))
    with pytest.raises(UserError, match=r"retrieve\?token=\*\*\*") as caught:
        retriever.search("Nikrom")
    assert "abc123" not in str(caught.value)
