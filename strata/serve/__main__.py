"""`python -m strata.serve [flags]`: the same as `strata serve [flags]`."""

import sys

from strata.serve.cli import main

sys.exit(main())
