"""A checkpoint mirror for the `imported_setter` scenario of tests/_hang_patterns_job.py (a module of the job,
never imported by the tests): its thread's target holds a `yield`, so the thread ends at once and the Event is
never set, and at the hang no thread's stack passes through this file."""

import threading


class Mirror:
    def __init__(self) -> None:
        self.synced = threading.Event()
        self._thread = threading.Thread(target=self.sync, name="ckpt-mirror", daemon=True)
        self._thread.start()

    def sync(self):
        """Copy each checkpoint to the mirror, yielding its name as it lands."""
        for name in ("step-10", "step-20"):
            copied = f"mirror/{name}"
            yield copied
        self.synced.set()  # HANG-LINE mirror-set
