"""`environ.snapshot`: copying the environment while another thread changes it (MLflow's telemetry thread does)."""

import os
import threading
from collections.abc import Mapping

from components import tracking
from components.environ import snapshot


class VanishingEnviron(Mapping):
    """Like `os.environ` read while another thread sets and deletes a variable: each pass over the names lists
    `vanishing`, and its value is gone by the time it is read (for the first `times` passes)."""

    def __init__(self, data: dict[str, str], vanishing: str, times: int = 1):
        self.data, self.vanishing, self.value, self.times = dict(data), vanishing, data[vanishing], times

    def __iter__(self):
        if self.times > 0:
            self.data[self.vanishing] = self.value  # "another thread" sets it again ...
        for name in list(self.data):
            if name == self.vanishing and self.times > 0:
                self.times -= 1
                self.data.pop(name)  # ... and removes it after it was listed, before its value is read
            yield name

    def __getitem__(self, name):
        return self.data[name]

    def __len__(self):
        return len(self.data)


def test_a_plain_copy_of_a_vanishing_variable_raises_the_key_error():
    environ = VanishingEnviron({"_MLFLOW_TELEMETRY_SESSION_ID": "abc", "HOME": "/root"}, "_MLFLOW_TELEMETRY_SESSION_ID")
    try:
        dict(environ.items())
    except KeyError as error:
        assert error.args == ("_MLFLOW_TELEMETRY_SESSION_ID",)
    else:
        raise AssertionError("the simulated race did not happen")


def test_snapshot_retries_and_returns_what_is_left():
    environ = VanishingEnviron({"_MLFLOW_TELEMETRY_SESSION_ID": "abc", "HOME": "/root"}, "_MLFLOW_TELEMETRY_SESSION_ID")
    assert snapshot(environ) == {"HOME": "/root"}


def test_snapshot_last_pass_skips_names_that_keep_vanishing():
    environ = VanishingEnviron({"A_TOKEN": "x" * 8, "HOME": "/root", "Z": "1"}, "HOME", times=100)
    assert snapshot(environ, attempts=3) == {"A_TOKEN": "x" * 8, "Z": "1"}


def test_secret_values_survive_a_variable_removed_mid_read():
    environ = VanishingEnviron({"_MLFLOW_TELEMETRY_SESSION_ID": "abc", "OPENAI_API_KEY": "sk-live-123456"},
                               "_MLFLOW_TELEMETRY_SESSION_ID")
    assert tracking.secret_values(environ) == ["sk-live-123456"]


def test_snapshot_of_the_real_environment_while_a_thread_sets_and_deletes_a_variable():
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            os.environ["STAR_TEST_CHURN"] = "1"
            os.environ.pop("STAR_TEST_CHURN", None)

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    try:
        for _ in range(2000):
            copy = snapshot()
            assert copy.get("PATH") == os.environ.get("PATH")
    finally:
        stop.set()
        thread.join()
