"""``python -m gpuguard`` runs the CLI."""

import sys

from gpuguard.cli import main

sys.exit(main())
