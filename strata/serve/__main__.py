"""`python -m strata.serve [flags]`: the same as `strata serve [flags]`."""

import sys

from strata.cli.serve import main

sys.exit(main())
