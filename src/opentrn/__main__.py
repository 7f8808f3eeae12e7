from opentrn.cli import main

raise SystemExit(main())
