try:
    from minispec.commands.cli import main
except KeyboardInterrupt:  # Ctrl-C before the front door is open: exit as quietly as after
    raise SystemExit(130) from None

raise SystemExit(main())
