from minispec.cli import main

raise SystemExit(main())
