from harness.cli import main

if __name__ == "__main__":  # the fork server imports this module again as __mp_main__
    main()
