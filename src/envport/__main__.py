import sys

from envport.cli import main

sys.exit(main())
