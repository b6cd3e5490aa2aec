"""`python -m caiplatform.cli`."""

import sys

from caiplatform.cli import main

sys.exit(main())
