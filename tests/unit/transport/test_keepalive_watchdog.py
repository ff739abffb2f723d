"""The SSH keepalive watchdog's verdict (pdboot/transport/ssh.py, _Watchdog) must not depend
on which of its two threads runs first after the process was paused: an answer that came
later than ``lost_after`` is silence, whoever sees it. A plain object stands in for
paramiko's Transport (it only needs global_request, is_active and close)."""

from __future__ import annotations

import threading
import time

from pdboot.transport.ssh import _Watchdog


class _SlowPeer:
    """Answers every keepalive, each after ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.closed = threading.Event()

    def global_request(self, kind: str, wait: bool = True) -> None:
        assert kind == "keepalive@openssh.com" and wait
        if self.closed.wait(self.delay):
            raise EOFError("closed")

    def is_active(self) -> bool:
        return not self.closed.is_set()

    def close(self) -> None:
        self.closed.set()


def _verdict(delay: float, lost_after: float, paused: float = 0.0) -> str | None:
    """The watchdog's ``lost`` for a peer answering after ``delay`` s, within 1.5 s (past
    the watch thread's first look); ``paused``: the last answer made that much older once
    the threads run, as a paused process finds it when it resumes."""
    peer = _SlowPeer(delay)
    dog = _Watchdog("h", peer, interval=0.01, lost_after=lost_after)  # type: ignore[arg-type]
    try:
        if paused:
            time.sleep(0.1)
            dog.last_answer -= paused
        peer.closed.wait(1.5)
        assert peer.closed.is_set() == (dog.lost is not None)  # closed exactly when lost
        return dog.lost
    finally:
        dog.stop()
        peer.close()


def test_a_pause_is_silence_whichever_thread_wakes_first() -> None:
    # the ping thread wakes within 10 ms and the peer answers at once; the watch thread looks
    # only once a second, so the ping thread must judge the gap before it counts the answer
    lost = _verdict(delay=0.0, lost_after=12.0, paused=13.0)
    assert lost is not None and "no answer for 13s" in lost


def test_an_answer_later_than_the_limit_counts_as_silence() -> None:
    lost = _verdict(delay=0.5, lost_after=0.2)
    assert lost is not None and "no answer for" in lost


def test_prompt_answers_keep_the_transport() -> None:
    assert _verdict(delay=0.0, lost_after=0.5) is None
