"""``python -m benchmarks.time_left``."""

from .bench import main

if __name__ == "__main__":
    main()
