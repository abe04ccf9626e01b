"""The vLLM backend without a GPU: a clear install hint, and the logprob extraction."""
from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from components.agent.vllm_backend import sampled_logprobs
from components.errors import UserError


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_missing_vllm_says_which_extra_to_install(tmp_path):
    from components.agent.vllm_backend import VLLMPolicy

    with pytest.raises(UserError, match=r"pip install 'star-pipeline\[gpu\]'"):
        VLLMPolicy(str(tmp_path))


def test_sampled_logprobs_reads_the_chosen_token_at_each_position():
    positions = [{11: SimpleNamespace(logprob=-0.5), 3: SimpleNamespace(logprob=-2.0)},
                 {2: SimpleNamespace(logprob=-0.1)}]
    assert sampled_logprobs([11, 2], positions) == [-0.5, -0.1]
    assert sampled_logprobs([11, 2], None) is None
