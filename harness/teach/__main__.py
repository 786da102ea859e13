import sys

from harness.teach import main

sys.exit(main())
