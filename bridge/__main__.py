"""``python -m bridge`` is the same as the ``seb`` console script."""

from bridge.cli import main

if __name__ == "__main__":
    main()
