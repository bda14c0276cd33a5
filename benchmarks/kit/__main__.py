"""``python -m benchmarks.kit``."""

from .bench import main

if __name__ == "__main__":
    main()
