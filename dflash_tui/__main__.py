from dflash_tui.cli import main

raise SystemExit(main())
