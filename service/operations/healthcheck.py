"""`python -m service.operations.healthcheck [URL]`: exit 0 if the URL answers 200 within 3 s, else 1 (Docker
HEALTHCHECK).

Standard library only, so it runs in the slim serving image without extra tools (no curl there).
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:8000/health/ready"


def check(url: str = DEFAULT_URL, timeout_s: float = 3.0) -> bool:
    """True when `url` answers HTTP 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def main(argv: list[str]) -> int:
    url = argv[1] if len(argv) > 1 else DEFAULT_URL
    healthy = check(url)
    print(f"{url}: {'healthy' if healthy else 'unhealthy'}")
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
