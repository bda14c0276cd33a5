"""``python -m benchmarks.data``."""

from .bench import main

if __name__ == "__main__":
    main()
