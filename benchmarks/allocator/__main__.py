"""``python -m benchmarks.allocator``."""

from .bench import main

if __name__ == "__main__":
    main()
