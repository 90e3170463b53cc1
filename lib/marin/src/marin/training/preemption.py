"""The preemption notice: save at the next step boundary and exit, instead of losing steps.

Preemptible TPU VMs get SIGTERM (the maintenance event) shortly before they go. ``train_loop``
watches for it through :class:`PreemptionWatch`: after each step it asks whether a notice
came; if so it saves that step's checkpoint (unless one was just written), waits for the
save to finish, and raises :class:`TrainingPreempted`, a ``SystemExit`` with code
:data:`PREEMPTED_EXIT_CODE` (143, the shell's code for SIGTERM), so a script that does not
catch it exits 143 with its checkpoint complete. The next attempt resumes from that step.

- One process (``jax.process_count() == 1``): a SIGTERM handler (installed from the main
  thread while training runs, the previous handler restored after) sets a flag.
- Several processes: every host must save the same step, so the decision is orbax's
  ``CheckpointManager.reached_preemption(step)``, which JAX's distributed runtime syncs
  across hosts (its preemption notifier watches SIGTERM itself, so no Python handler is
  installed there). This path needs a real multi-host slice and is not tested here.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

__all__ = ["PREEMPTED_EXIT_CODE", "PreemptionWatch", "TrainingPreempted"]

logger = logging.getLogger(__name__)

PREEMPTED_EXIT_CODE = 143


class TrainingPreempted(SystemExit):
    """Training stopped on a preemption notice after saving ``step`` (exit code 143)."""

    def __init__(self, step: int, checkpoint_path: str):
        super().__init__(PREEMPTED_EXIT_CODE)
        self.step, self.checkpoint_path = step, checkpoint_path

    def __str__(self) -> str:
        return f"preempted: saved step {self.step} to {self.checkpoint_path}; a restart resumes there"


class PreemptionWatch:
    """While entered, records a SIGTERM (one process) or asks orbax (several) at each step."""

    def __init__(self, process_count: int = 1):
        self.notice = threading.Event()
        self._multi = process_count > 1
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> PreemptionWatch:
        if not self._multi:
            if threading.current_thread() is threading.main_thread():
                self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
                self._installed = True
            else:
                logger.warning("training outside the main thread: a SIGTERM cannot be caught to save first")
        return self

    def __exit__(self, *exc) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False

    def _on_sigterm(self, signum, frame) -> None:
        logger.warning("SIGTERM: saving at the next step boundary, then exiting with %d", PREEMPTED_EXIT_CODE)
        self.notice.set()

    def requested(self, step: int, manager: Any = None) -> bool:
        """Whether to save ``step`` and stop: the local notice, or (several hosts) orbax's synced check."""
        if self._multi:
            check = getattr(manager, "reached_preemption", None)
            return bool(check(step)) if check is not None else False
        return self.notice.is_set()
