import sys

from caiplatform.cli import main

sys.exit(main())
