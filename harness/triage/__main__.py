import sys

from harness.triage.cli import main

sys.exit(main())
