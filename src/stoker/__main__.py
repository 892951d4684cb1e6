"""``python -m stoker`` runs the command line."""

import sys

from .cli import main

if __name__ == "__main__":  # importing this module (docs tools inspect every one) runs nothing
    sys.exit(main())
