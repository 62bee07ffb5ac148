"""`python -m streamtx` is the `streamtx` command."""

from streamtx.cli import main

raise SystemExit(main())
