"""lifeline.raise_if_stopping: once `star run` / `star sweep` forwarded a stop, what its children report is that stop."""
import signal

import pytest

from components import lifeline


@pytest.fixture(autouse=True)
def not_stopping():
    yield
    lifeline._STOPPING.clear()


def test_nothing_is_raised_while_the_command_runs():
    lifeline.raise_if_stopping()


@pytest.mark.parametrize("sig, raised", [(signal.SIGTERM, lifeline.Terminated), (signal.SIGINT, KeyboardInterrupt)])
def test_a_forwarded_stop_is_raised_as_the_interruption_it_was(sig, raised):
    lifeline.forward_stop(sig)
    with pytest.raises(raised) as caught:
        lifeline.raise_if_stopping()
    if sig == signal.SIGINT:
        assert not isinstance(caught.value, lifeline.Terminated)  # Ctrl-C exits 130, not SIGTERM's 143
