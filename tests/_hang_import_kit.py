"""Imported by tests/_hang_waits_job.py's `import_join` scenario (never run alone): its top-level code starts a
thread that imports this very module, then joins that thread while this import is still in progress (held-out
hang set 10, j07's class: an evaluation kit that primes a cache in a thread at import time)."""
import threading


def _prime() -> None:
    import _hang_import_kit  # noqa: F401,PLW0406  # HANG-LINE import-in-thread


_loader = threading.Thread(target=_prime, name="kit-prime")
_loader.start()
_loader.join()  # HANG-LINE import-join
