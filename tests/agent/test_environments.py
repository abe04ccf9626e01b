"""Every registered environment has the same shape: the same modules, the one `Step` type, and the same behaviour
after its episode ends (stepping raises `EpisodeEnded` until `reset()`)."""
from __future__ import annotations

import importlib

import pytest

from components import environments
from components.agent.environment import EpisodeEnded, Step
from components.toolstar.sandbox import SandboxResult

MODULES = ("env", "tasks", "expert", "reward", "evaluate", "source")


class OnePassage:
    def search(self, query):
        return [{"id": "1", "title": "Two", "text": "Two is one plus one."}]


class PrintsTwo:
    def run(self, code):
        return SandboxResult(stdout="2\n", stderr="", exit_code=0, signal=None, limit=None, truncated=False,
                             seconds=0.0, isolation="none", error=None)


def travel_env(tiny_world):
    from components.travel.env import TravelEnv
    from components.travel.tasks import Query
    from training.rl.conftest import make_queries

    return TravelEnv(tiny_world, Query.from_dict(make_queries(tiny_world, 1)[0])), "<answer>[]</answer>"


def toolstar_env(tiny_world):
    from components.toolstar.env import ToolStarEnv

    answer = "<think> done </think>\n<answer> The final answer is \\boxed{2} </answer>"
    return ToolStarEnv({"question": "What is 1 + 1?"}, OnePassage(), PrintsTwo()), answer


def qa_env(tiny_world):
    from components.qa.env import QAEnv

    return QAEnv("What is one plus one?", OnePassage()), "<answer>two</answer>"


EPISODES = {"travel": travel_env, "toolstar": toolstar_env, "qa": qa_env}


def test_the_registry_names_every_environment_package():
    assert environments.kinds() == sorted(EPISODES)


@pytest.mark.parametrize("kind", sorted(EPISODES))
def test_every_environment_package_has_the_same_modules(kind):
    package = f"components.{kind}"
    assert [importlib.import_module(f"{package}.{name}").__name__ for name in MODULES] == \
        [f"{package}.{name}" for name in MODULES]
    source = environments.source_module(kind)
    assert source.KIND == kind and source.REWARD_COLUMNS[:2] == ["step", "reward"]


@pytest.mark.parametrize("kind", sorted(EPISODES))
def test_an_answer_ends_the_episode_and_a_step_after_it_raises_until_reset(kind, tiny_world):
    env, answer = EPISODES[kind](tiny_world)
    messages = env.reset()
    assert [m["role"] for m in messages] == ["system", "user"]
    step = env.step(answer)
    assert isinstance(step, Step) and step.done and step.observation is None
    assert step.info["termination"] == "answer"
    with pytest.raises(EpisodeEnded, match="call reset"):
        env.step(answer)
    env.reset()
    assert env.step(answer).done


@pytest.mark.parametrize("kind", sorted(EPISODES))
def test_a_malformed_turn_is_an_observation_not_an_error(kind, tiny_world):
    env, _ = EPISODES[kind](tiny_world)
    env.reset()
    step = env.step("no tags at all")
    assert not step.done and step.info["kind"] == "protocol_error" and "Error" in step.observation


def test_an_unknown_kind_says_which_kinds_there_are():
    with pytest.raises(Exception, match=r"env.kind 'chess' is not a registered environment: use one of \['qa', "):
        environments.source_module("chess")
