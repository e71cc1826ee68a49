import sys

from spanrl.cli import main

sys.exit(main())
