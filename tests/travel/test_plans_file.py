"""`star evaluate`'s plans file: one {"idx", "plan"} object a line; every malformed file is an error naming it."""
import pytest

from components.errors import UserError
from components.travel.commands import read_plans


def write(tmp_path, text):
    path = tmp_path / "plans.jsonl"
    path.write_text(text)
    return path


def test_plans_are_read_by_idx(tmp_path):
    path = write(tmp_path, '{"idx": 1, "plan": []}\n\n{"idx": "2", "plan": "[{}]"}\n')
    assert read_plans(path) == {1: [], 2: "[{}]"}


@pytest.mark.parametrize("text, message", [
    ("", "holds no plans"),
    ("\n\n", "holds no plans"),
    ('{"idx": 1, "plan": []}\n{"idx": 1, "plan": [{}]}\n', ":2: idx 1 already has a plan (line 1)"),
    ('{"idx": 1, "plan": []}\n{"plan": []}\n', ':2: each line must be an object {"idx": i, "plan": [...]}'),
    ('{"idx": "one", "plan": []}\n', ":1: idx must be an integer, got 'one'"),
    ('{"idx": 1, "plan": [\n', ":1: not valid JSON"),
])
def test_a_malformed_plans_file_is_an_error_that_names_it(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(UserError) as error:
        read_plans(path)
    assert str(path) in str(error.value) and message in str(error.value)
