"""`python -m retrieval_api`: run the Retrieve server."""

import sys

from retrieval_api.app import main

sys.exit(main())
