"""``python -m benchmarks.run``."""

from .bench import main

if __name__ == "__main__":
    main()
