"""``python -m benchmarks.allreduce``."""

from .bench import main

if __name__ == "__main__":
    main()
