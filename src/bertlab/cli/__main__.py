"""`python -m bertlab.cli` = `bertlab`."""
import sys

from . import main

sys.exit(main())
