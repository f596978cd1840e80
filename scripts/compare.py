#!/usr/bin/env python
"""Compare privacy protections on one dataset: ``python scripts/compare.py --help``."""

from __future__ import annotations

import sys

from alm_opacus.run.cli import main

if __name__ == "__main__":
    sys.exit(main())
