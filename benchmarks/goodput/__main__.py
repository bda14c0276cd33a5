"""``python -m benchmarks.goodput``."""

from .bench import main

if __name__ == "__main__":
    main()
