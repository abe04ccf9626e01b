"""Benchmark the QA search tool's retriever: bm25s (ours) vs rank_bm25 (the common pure-Python baseline).

Same generated encyclopedia, same tokenisation (bm25s's English stop words, lowercase), same questions, side by
side in one process: index build time, queries per second (one query at a time, as the QA env calls it, and as
one batch), and the top-5 recall of each on the single-hop questions (both should agree: same BM25 family).

    python benchmarks/bench_retriever.py                   # ~20K passages
    python benchmarks/bench_retriever.py --people 2000     # quick
"""
from __future__ import annotations

import argparse
import platform
import time

import bm25s
import numpy as np

from components.qa.corpus import build_encyclopedia
from components.retrieval import BM25Retriever


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--people", type=int, default=14000)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--top-k", type=int, default=5)
    args = parser.parse_args()
    try:
        from rank_bm25 import BM25Okapi
    except ImportError:
        raise SystemExit("the baseline needs rank_bm25: pip install rank-bm25") from None

    book = build_encyclopedia(args.people, args.people // 5, args.people // 7, args.queries, seed=0)
    passages = [p.to_dict() for p in book.passages]
    questions = book.questions["single_hop"]
    texts = [q["question"] for q in questions]
    print(f"{len(passages)} passages, {len(questions)} single-hop questions, top-{args.top_k}; "
          f"{platform.processor() or platform.machine()}, python {platform.python_version()}")

    ours, ours_build = timed(lambda: BM25Retriever(passages, top_k=args.top_k))
    ours_hits, ours_one = timed(lambda: [ours.search(t) for t in texts])
    _, ours_batch = timed(lambda: ours.batch_search(texts))

    def tokens(strings):
        return bm25s.tokenize(strings, stopwords="en", return_ids=False, show_progress=False)

    baseline, base_build = timed(lambda: BM25Okapi(tokens([f"{p['title']} {p['text']}" for p in passages])))
    base_hits, base_one = timed(lambda: [np.argsort(-baseline.get_scores(t))[: args.top_k] for t in tokens(texts)])

    ours_recall = np.mean([q["gold_passages"][0] in {p["id"] for p in hits} for q, hits in zip(questions, ours_hits)])
    base_recall = np.mean([q["gold_passages"][0] in {passages[i]["id"] for i in hits}
                           for q, hits in zip(questions, base_hits)])
    n = len(texts)
    print(f"{'':<28}{'bm25s (ours)':>14}{'rank_bm25':>14}{'ratio':>10}")
    print(f"{'index build (s)':<28}{ours_build:>14.3f}{base_build:>14.3f}{base_build / ours_build:>9.1f}x")
    print(f"{'queries/s, one at a time':<28}{n / ours_one:>14.0f}{n / base_one:>14.0f}{base_one / ours_one:>9.1f}x")
    print(f"{'queries/s, one batch':<28}{n / ours_batch:>14.0f}{'-':>14}{base_one / ours_batch:>9.1f}x")
    print(f"{'recall@' + str(args.top_k):<28}{ours_recall:>14.3f}{base_recall:>14.3f}")


if __name__ == "__main__":
    main()
