"""``python -m benchmarks.time_to_accuracy``."""

from .bench import main

if __name__ == "__main__":
    main()
