"""``python -m tiffany``: the same as the ``tiffany`` command."""

from tiffany.cli import main

if __name__ == "__main__":
    main()
