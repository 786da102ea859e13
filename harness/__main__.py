import sys

from harness.cases import fork_server_modules
from harness.compiled import requested
from harness.process.fork_server import start_fork_server

if __name__ == "__main__":  # the fork server imports this module again as __mp_main__
    if sys.argv[1:2] == ["new"]:  # python -m harness new <name>: a case's scaffold, no Hydra and no fork server
        from harness.scaffold import main as new

        raise SystemExit(new(sys.argv[2:]))
    start_fork_server(
        fork_server_modules(compiling=requested(sys.argv[1:]))
    )  # first: it imports torch and the cases while this process imports the rest
    from harness.cli import main

    main()
