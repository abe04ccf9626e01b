"""Query synthesis on the tiny world: counts per level, feasibility, disjoint splits, held-out validation cities,
the budget rule, constraints by level, and query text (templates and LLM back-translation)."""
import json
import random

from components.travel.expert import ExpertConfig, solve_with_tools
from components.travel.skeleton import budget_for, city_pool, sample_constraints, sample_skeleton
from components.travel.queries import level_counts, signature
from components.travel.query_text import back_translate, render_query_text, spoken_date
from components.travel.evaluate import evaluate_plan

from agent.fake_openai import FakeOpenAI


def test_each_split_has_the_requested_count_per_level(tiny_splits):
    splits, summary = tiny_splits
    assert {name: len(qs) for name, qs in splits.items()} == {"sft": 20, "rl": 10, "val": 10}
    for name, queries in splits.items():
        counts = {level: sum(q.level == level for q in queries) for level in ("easy", "medium", "hard")}
        assert counts == level_counts(len(queries), {"easy": 4, "medium": 3, "hard": 3})
        assert [q.idx for q in queries] == list(range(len(queries)))
    assert summary["attempts"] >= 40 and sum(summary["rejected"].values()) == summary["attempts"] - 40


def test_every_query_is_feasible_a_fresh_solver_run_passes_it(tiny_world, tiny_splits):
    splits, _ = tiny_splits
    for queries in splits.values():
        for query in queries:
            outcome, _ = solve_with_tools(tiny_world, query, ExpertConfig(seed=99))
            assert evaluate_plan(tiny_world, query, outcome.plan).final_pass, query


def test_splits_are_disjoint_and_validation_uses_only_held_out_states(tiny_world, tiny_splits):
    splits, _ = tiny_splits
    signatures = {name: {signature(q.to_dict()) for q in qs} for name, qs in splits.items()}
    assert not (signatures["sft"] & signatures["rl"]) and not (signatures["val"] & (signatures["sft"] | signatures["rl"]))
    held = set(tiny_world.holdout_states)
    assert held, "the tiny world holds out a state"

    def states(query):
        dest_state = query.dest if query.days > 3 else tiny_world.state_of(query.dest)
        return {tiny_world.state_of(query.org), dest_state}

    assert all(states(q) <= held for q in splits["val"])
    assert all(not (states(q) & held) for name in ("sft", "rl") for q in splits[name])


def test_level_counts_follow_the_mix_and_sum_to_the_total():
    assert level_counts(10, {"easy": 4, "medium": 3, "hard": 3}) == {"easy": 4, "medium": 3, "hard": 3}
    assert sum(level_counts(7, {"easy": 4, "medium": 3, "hard": 3}).values()) == 7
    assert level_counts(5, {"easy": 1, "medium": 0, "hard": 0}) == {"easy": 5, "medium": 0, "hard": 0}


def test_constraints_by_level():
    rng = random.Random(0)
    for _ in range(50):
        assert all(v is None for v in sample_constraints("easy", rng).values())
        medium = sample_constraints("medium", rng)
        assert sum(v is not None for v in medium.values()) == 1 and medium["transportation"] is None
        assert medium["cuisine"] is None or len(medium["cuisine"]) == 2
        hard = sample_constraints("hard", rng)
        assert hard["transportation"] in ("no flight", "no self-driving")
        assert sum(hard[k] is not None for k in ("house rule", "cuisine", "room type")) == 2


def test_budget_rule_from_low_average_and_high_pool_prices():
    pool = {"flights": [100.0, 200.0, 300.0], "stays": [50.0, 150.0], "meals": [10.0, 30.0]}
    # low = 100*2 + 50*3 + 10*9 = 440; avg = 200*2 + 100*3 + 20*9 = 880; 3 days -> (880 + 440) / 2 = 660 -> 700
    assert budget_for({"days": 3, "level": "easy", "people_number": 1}, pool) == 700
    # 5 days: avg = 200*3 + 100*5 + 20*15 = 1400; medium x 4 people x 0.75 = 4200
    assert budget_for({"days": 5, "level": "medium", "people_number": 4}, pool) == 4200
    # 7 days: avg = 200*4 + 100*7 + 20*21 = 1920, high = 300*4 + 150*7 + 30*21 = 2880 -> 2400; hard x 2 x 0.5
    assert budget_for({"days": 7, "level": "hard", "people_number": 2}, pool) == 2400


def test_template_text_states_every_field_with_varied_phrasing(tiny_splits):
    query = next(q for q in tiny_splits[0]["sft"] if q.level == "hard")
    fields = query.to_dict()
    texts = {render_query_text(fields, random.Random(seed)) for seed in range(12)}
    assert len(texts) > 3
    for text in texts:
        assert fields["org"] in text and fields["dest"] in text and f"${fields['budget']:,}" in text
        assert spoken_date(fields["date"][0]) in text and spoken_date(fields["date"][-1]) in text
        for cuisine in fields["local_constraint"]["cuisine"] or []:
            assert cuisine in text


def test_llm_back_translation_is_few_shot_and_falls_back_on_an_empty_reply(tiny_splits):
    from components.agent.http import EndpointConfig, OpenAIChatClient

    fields = tiny_splits[0]["sft"][0].to_dict()
    replies = iter(["A lovely trip request.", ""])
    with FakeOpenAI(lambda body, n: (200, next(replies), 0.0)) as server:
        client = OpenAIChatClient(EndpointConfig(base_url=server.base_url, model="writer"))
        assert back_translate(client, fields, shots=2) == "A lovely trip request."
        assert back_translate(client, fields, shots=2) is None
    messages = server.requests[0]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert json.loads(messages[-1]["content"])["budget"] == fields["budget"]


def test_same_state_fraction_sets_how_often_a_one_city_trip_stays_in_its_origins_state(tiny_world):
    pool = city_pool(tiny_world, holdout=False)

    def same_state_share(fraction, draws=200):
        rng = random.Random(0)
        skeletons = [s for s in (sample_skeleton(tiny_world, pool, "easy", rng, (3,), False, fraction)
                                 for _ in range(draws)) if s]
        return sum(pool.state_of[s["org"]] == pool.state_of[s["dest"]] for s in skeletons) / len(skeletons)

    assert same_state_share(1.0) == 1.0
    assert same_state_share(0.0) == 0.0
    assert 0.35 < same_state_share(0.5) < 0.65

