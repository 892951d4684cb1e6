"""``python -m stoker.workers FD PATH SIZE WID LAUNCHED``: the entry point of a worker process
(see :mod:`stoker.workers.launch`); started by the loader, not by hand."""

import sys

from .launch import main

main(sys.argv[1:])
