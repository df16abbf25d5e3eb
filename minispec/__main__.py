try:
    from minispec.commands.cli import main

    code = main()
except KeyboardInterrupt:  # Ctrl-C outside the front door (before it opens, or as it closes)
    code = 130
raise SystemExit(code)
