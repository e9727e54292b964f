"""`python -m longhaul_cpp`: the longhaul-cpp command line (longhaul_cpp.cli)."""
import sys

from .cli import main

sys.exit(main())
