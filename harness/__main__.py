import sys

from harness.cases import fork_server_modules
from harness.compiled import requested
from harness.isolate import start_fork_server

if __name__ == "__main__":  # the fork server imports this module again as __mp_main__
    start_fork_server(fork_server_modules(compiling=requested(sys.argv[1:])))  # first: it imports torch and the cases while this process imports the rest
    from harness.cli import main

    main()
