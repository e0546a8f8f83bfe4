"""`python -m streams`: run the ingest worker."""

import sys

from streams.app import main

sys.exit(main())
