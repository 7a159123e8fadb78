import sys

from lightning_otel.cli import main

sys.exit(main())
