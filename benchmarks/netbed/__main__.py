"""``python -m benchmarks.netbed``."""

from .bench import main

if __name__ == "__main__":
    main()
