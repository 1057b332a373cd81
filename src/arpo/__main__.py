import sys

from arpo.cli import main

sys.exit(main())
