"""``python -m loraplex`` runs the CLI."""

from loraplex.cli.main import main

raise SystemExit(main())
