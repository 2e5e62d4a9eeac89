#!/usr/bin/env python3
"""Runs ``check_manifests`` from a checkout with nothing installed (also the pre-commit hook)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cake.checker import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
