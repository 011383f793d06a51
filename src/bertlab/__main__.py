"""`python -m bertlab` (and `torchrun -m bertlab`) = the `bertlab` command."""
import sys

from .cli import main

sys.exit(main())
