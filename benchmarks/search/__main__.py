"""``python -m benchmarks.search``."""

from .bench import main

if __name__ == "__main__":
    main()
