"""``python -m witcert``: the same as the ``witcert`` console script."""

import sys

from witcert.cli import main

sys.exit(main())
