import sys

from exchange_broker.cli import main

sys.exit(main())
