"""``python -m benchmarks.checkpoints``."""

from .bench import main

if __name__ == "__main__":
    main()
