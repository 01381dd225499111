"""`python -m chronq ...` runs the same command as the `chronq` console script."""

from chronq.cli import main

raise SystemExit(main())
