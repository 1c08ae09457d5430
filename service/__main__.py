from service.ops.cli import main

raise SystemExit(main())
