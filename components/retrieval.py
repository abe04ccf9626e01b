"""Retrievers behind the QA `search` tool: BM25 over a local corpus (bm25s) or a Search-R1/FlashRAG HTTP server.

Both return passages as dicts `{"id", "title", "text"}`; `format_passages` renders them the way Search-R1 shows
them to the model (`Doc 1(Title: ...) text`).
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, Protocol

import bm25s
import httpx
from pydantic import Field

from components.errors import UserError
from components.params import Params


class Retriever(Protocol):
    """Top-k passage search."""

    top_k: int

    def search(self, query: str) -> list[dict]: ...

    def batch_search(self, queries: Sequence[str]) -> list[list[dict]]: ...


def split_contents(contents: str) -> tuple[str, str]:
    """Split a FlashRAG/Search-R1 `contents` field ('"Title"\\ntext') into (title, text)."""
    first, _, rest = contents.partition("\n")
    return first.strip().strip('"'), rest.strip()


def passage_from_record(record: dict) -> dict:
    """Normalise a corpus line (ours: id/title/text; FlashRAG: id/contents) to {"id", "title", "text"}."""
    if "title" in record and "text" in record:
        return {"id": str(record.get("id", "")), "title": record["title"], "text": record["text"]}
    if "contents" in record:
        title, text = split_contents(record["contents"])
        return {"id": str(record.get("id", "")), "title": title, "text": text}
    raise UserError(f"corpus line {record!r:.80} has neither title/text nor contents: use the FlashRAG JSONL format")


def load_corpus(path: str | Path) -> list[dict]:
    """Read a JSONL corpus (ours, or FlashRAG's `{"id", "contents"}` lines)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"corpus {path} does not exist (build it with `star qa build`)")
    with path.open() as f:
        return [passage_from_record(json.loads(line)) for line in f if line.strip()]


def format_passages(passages: list[dict]) -> str:
    """Render retrieved passages as the tool's observation (Search-R1's `Doc i(Title: t) text` lines)."""
    if not passages:
        return "No results."
    return "\n".join(f"Doc {i}(Title: {p['title']}) {p['text']}" for i, p in enumerate(passages, start=1))


def _index_text(passage: dict) -> str:
    return f"{passage['title']} {passage['text']}"


class BM25Retriever:
    """BM25 (Lucene variant, English stop words) over an in-memory corpus, via the `bm25s` library."""

    def __init__(self, passages: list[dict], top_k: int = 3, k1: float = 1.5, b: float = 0.75):
        if not passages:
            raise UserError("the retrieval corpus is empty: build it with `star qa build` or point to a JSONL corpus")
        self.passages = passages
        self.top_k = top_k
        self._bm25s = bm25s
        self.index = bm25s.BM25(k1=k1, b=b)
        self.index.index(bm25s.tokenize([_index_text(p) for p in passages], stopwords="en", show_progress=False),
                         show_progress=False)

    def batch_search(self, queries: Sequence[str]) -> list[list[dict]]:
        """Top-k passages for each query, best first."""
        if not queries:
            return []
        k = min(self.top_k, len(self.passages))
        tokens = self._bm25s.tokenize(list(queries), stopwords="en", show_progress=False)
        if not tokens.vocab:  # every query was stop words only
            return [[] for _ in queries]
        ids, scores = self.index.retrieve(tokens, k=k, show_progress=False)
        return [[self.passages[int(i)] for i, s in zip(row_ids, row_scores) if s > 0]
                for row_ids, row_scores in zip(ids, scores)]

    def search(self, query: str) -> list[dict]:
        """Top-k passages for one query."""
        return self.batch_search([query])[0]


class HTTPRetriever:
    """Client for a retrieval server with the Search-R1 / FlashRAG convention:
    `POST {url}` with `{"queries": [...], "topk": k, "return_scores": true}` answers
    `{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}`."""

    def __init__(self, url: str, top_k: int = 3, timeout_s: float = 30.0, client=None):
        self.url = url
        self.top_k = top_k
        self.client = client or httpx.Client(timeout=timeout_s)

    def batch_search(self, queries: Sequence[str]) -> list[list[dict]]:
        """Top-k passages for each query from the server."""
        try:
            response = self.client.post(self.url, json={"queries": list(queries), "topk": self.top_k,
                                                        "return_scores": True})
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise UserError(f"retrieval server {self.url} failed: {exc} (start it, e.g. Search-R1's "
                            "retrieval_launch.sh, or set ood_qa.retriever.kind: bm25)") from exc
        results = response.json().get("result")
        if not isinstance(results, list) or len(results) != len(queries):
            raise UserError(f"retrieval server {self.url} answered without a 'result' list per query")
        return [[passage_from_record(hit.get("document", hit)) for hit in hits] for hits in results]

    def search(self, query: str) -> list[dict]:
        """Top-k passages for one query."""
        return self.batch_search([query])[0]


class RetrieverParams(Params):
    """The search tool's retriever: BM25 over a JSONL corpus (default: the generated one), or an HTTP server."""

    kind: Literal["bm25", "http"] = "bm25"
    top_k: int = Field(3, ge=1)
    corpus: str | None = None
    url: str | None = None


def make_retriever(params: RetrieverParams, qa_dir: str | Path):
    """BM25 over the configured (or generated) corpus, or the HTTP client."""
    if params.kind == "http":
        if not params.url:
            raise UserError("ood_qa.retriever.kind is http but ood_qa.retriever.url is not set "
                            "(e.g. http://127.0.0.1:8000/retrieve)")
        return HTTPRetriever(params.url, top_k=params.top_k)
    return BM25Retriever(load_corpus(params.corpus or Path(qa_dir) / "corpus.jsonl"), top_k=params.top_k)
