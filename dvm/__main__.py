"""`python -m dvm ...` is the `dvm` command line."""
import sys

from .tools.cli import main

sys.exit(main())
