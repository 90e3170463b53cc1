import sys

from zephyr.cli import main

sys.exit(main())
