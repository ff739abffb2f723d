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


def test_a_pause_is_silence_whichever_thread_wakes_first() -> None:
    # a paused process: its last answer is 13 s old when it resumes (made so by hand here).
    # The ping thread wakes within 10 ms and the peer answers at once; the watch thread looks
    # only once a second, so the ping thread must judge the gap before it counts the answer
    peer = _SlowPeer(delay=0.0)
    dog = _Watchdog("h", peer, interval=0.01, lost_after=12.0)  # type: ignore[arg-type]
    try:
        time.sleep(0.1)
        dog.last_answer -= 13.0
        assert peer.closed.wait(5), "the pause went unnoticed"
        assert dog.lost is not None and "no answer for 13s" in dog.lost
    finally:
        dog.stop()


def test_an_answer_later_than_the_limit_counts_as_silence() -> None:
    peer = _SlowPeer(delay=0.5)
    dog = _Watchdog("h", peer, interval=0.01, lost_after=0.2)  # type: ignore[arg-type]
    try:
        assert peer.closed.wait(5), "the watchdog never closed the transport"
        assert dog.lost is not None and "no answer for" in dog.lost
    finally:
        dog.stop()


def test_prompt_answers_keep_the_transport() -> None:
    peer = _SlowPeer(delay=0.0)
    dog = _Watchdog("h", peer, interval=0.01, lost_after=0.5)  # type: ignore[arg-type]
    try:
        time.sleep(1.5)  # past the watch thread's first look
        assert dog.lost is None and not peer.closed.is_set()
    finally:
        dog.stop()
        peer.close()
