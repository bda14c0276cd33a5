"""``python -m benchmarks.lending``."""

from .bench import main

if __name__ == "__main__":
    main()
