"""``python -m benchmarks.heterogeneous``."""

from .bench import main

if __name__ == "__main__":
    main()
