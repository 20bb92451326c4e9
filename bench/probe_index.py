"""Probe a package index once, quickly, before pip would retry it for minutes (used by `make setup`).

    python bench/probe_index.py URL [--timeout S]

Exit 0 when the index answers (any HTTP status: it is reachable), 2 with one line saying what to do when
it cannot be reached within the timeout. Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request


def probe(url: str, timeout_s: float) -> str:
    """'' when `url` answered, else why not in a few words."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):  # noqa: S310 - the index the user named
            return ""
    except urllib.error.HTTPError:
        return ""  # it answered: reachable (a 403/404 is pip's business)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return str(reason) or type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args(argv)
    why = probe(args.url, args.timeout)
    if not why:
        return 0
    print(
        f"make: the torch index {args.url} cannot be reached ({why}); rerun with TORCH_INDEX= to install "
        "torch from your default index (on PyPI a CUDA build of several GB), or TORCH_INDEX=<a mirror you "
        "can reach>, or install torch in .venv yourself",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
