"""Test helper: train the tiny LM from a token cache; at call ``pause_at`` of the step, write
``ready`` and wait (up to 120 s) for the SIGTERM the test sends, then carry on.

Usage: python train_until_sigterm.py CACHE CHECKPOINTS NUM_STEPS PAUSE_AT READY
(PAUSE_AT 0: never pause). Exits 143 after the preemption save (train_loop's TrainingPreempted).
"""

import signal
import sys
import time

from marin.training import tiny_lm
from marin.training.train import train_loop

cache, checkpoints, num_steps, pause_at, ready = sys.argv[1:6]
calls = 0


def step(state, batch):
    global calls
    calls += 1
    if calls == int(pause_at):
        notice = signal.getsignal(signal.SIGTERM).__self__.notice  # train_loop's PreemptionWatch
        open(ready, "w").write(str(calls))
        deadline = time.monotonic() + 120
        while not notice.is_set() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not notice.is_set():
            sys.exit("no SIGTERM came")
    return tiny_lm.train_step(state, batch)


train_loop(step, tiny_lm.init_state, cache, batch_size=8, seq_len=16, num_steps=int(num_steps),
           checkpoint_path=checkpoints, checkpoint_every=5)
