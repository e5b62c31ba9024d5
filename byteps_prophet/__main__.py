import sys

from byteps_prophet.cli import main

sys.exit(main())
