from minispec.commands.cli import main

raise SystemExit(main())
